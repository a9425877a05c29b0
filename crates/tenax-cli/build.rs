//! Records the commit the binary was built from, for `tenax --version`.
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown commit".to_owned());
    println!("cargo:rustc-env=TENAX_COMMIT={commit}");
    // Rebuild when HEAD moves (a checkout, a commit on the current branch).
    if let Ok(out) = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .output()
    {
        if let Ok(dir) = String::from_utf8(out.stdout) {
            let dir = dir.trim();
            if !dir.is_empty() {
                println!("cargo:rerun-if-changed={dir}/HEAD");
                println!("cargo:rerun-if-changed={dir}/refs/heads");
            }
        }
    }
}
