//! `redlock completions SHELL`: a shell completion script, generated from the same definitions
//! as `--help` (clap_complete), on stdout.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::fail::{Fail, exit};

pub const HELP: &str = "\
Install, for example:
  redlock completions bash > ~/.local/share/bash-completion/completions/redlock
  redlock completions zsh > \"${fpath[1]}/_redlock\"
  redlock completions fish > ~/.config/fish/completions/redlock.fish";

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: Shell,
}

pub fn completions(a: &CompletionsArgs) -> Result<u8, Fail> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut crate::Cli::command(), "redlock", &mut script);
    let mut stdout = std::io::stdout().lock();
    std::io::Write::write_all(&mut stdout, &script)
        .and_then(|()| std::io::Write::flush(&mut stdout))
        .map_err(|e| Fail::new(exit::INTERNAL, format!("cannot write to stdout: {e}")))?;
    Ok(exit::OK)
}
