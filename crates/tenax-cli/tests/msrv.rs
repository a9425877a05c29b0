//! The minimum supported Rust version stated in the workspace is true of the locked
//! dependency tree: no dependency built on Linux declares a newer `rust-version`.
//! (Clippy's `incompatible_msrv` lint, run with `-D warnings`, checks our own code
//! against the same version.)
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

fn parse(version: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = version.split('.').map(|p| p.parse().unwrap()).collect();
    parts.resize(3, 0);
    parts
}

#[test]
fn no_locked_dependency_needs_a_newer_rust_than_the_stated_msrv() {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            "x86_64-unknown-linux-gnu",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let msrv = env!("CARGO_PKG_RUST_VERSION");
    assert!(!msrv.is_empty(), "the workspace states no rust-version");
    let built: std::collections::HashSet<&str> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    let too_new: Vec<String> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| built.contains(p["id"].as_str().unwrap()))
        .filter_map(|p| {
            let needs = p["rust_version"].as_str()?;
            (parse(needs) > parse(msrv))
                .then(|| format!("{} {} needs {needs}", p["name"], p["version"]))
        })
        .collect();
    assert!(too_new.is_empty(), "stated MSRV {msrv}, but: {too_new:?}");
}
