//! `sluice config defaults`: every setting as commented TOML, with its
//! default and environment variable (`config::reference`).

use clap::{Args, Subcommand};

use super::CliResult;

#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print every setting with its doc, environment variable and default,
    /// as a TOML file that loads as the defaults.
    Defaults,
}

pub async fn run(args: ConfigArgs) -> CliResult {
    match args.command {
        ConfigCommand::Defaults => print!("{}", crate::config::reference()),
    }
    Ok(())
}
