//! `submitter`: the login-node program. The command line lives in the library (`submitter::cli`).

fn main() -> std::process::ExitCode {
    submitter::cli::main()
}
