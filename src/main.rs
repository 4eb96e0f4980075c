//! The `nodeward` binary: parse the command line, set up logging, run one subcommand, print the
//! error chain and exit with its code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = nodeward::cli::Cli::parse();
    if let Err(e) = nodeward::logging::init(cli.log_level.as_deref()) {
        eprintln!("nodeward: {e}");
        return ExitCode::from(nodeward::commands::EXIT_USAGE);
    }
    match nodeward::commands::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("nodeward: {}", nodeward::commands::describe(&e));
            ExitCode::from(nodeward::commands::EXIT_FAILURE)
        }
    }
}
