//! `tenax`: the command line of the Tenax task scheduler (see the library target).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    tenax_cli::main()
}
