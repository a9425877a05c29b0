//! Rebuild when a migration is added: `sqlx::migrate!` embeds the files it finds at
//! compile time, and a new file changes no source file.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
