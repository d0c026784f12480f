//! `redlock man`: man pages, generated from the same definitions as `--help` (clap_mangen):
//! `redlock(1)` on stdout, or one page per subcommand written into a directory.

use std::path::PathBuf;

use clap::{Args, CommandFactory};

use crate::fail::{Fail, exit};

pub const HELP: &str = "\
Read it at once:     redlock man | man -l -
Install every page:  redlock man --dir /usr/local/share/man/man1";

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write redlock.1 and a page per subcommand (redlock-run.1, ...) into this directory
    /// instead of printing redlock.1
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn man(a: &ManArgs) -> Result<u8, Fail> {
    let cmd = crate::Cli::command();
    match &a.dir {
        Some(dir) => {
            clap_mangen::generate_to(cmd, dir).map_err(|e| {
                Fail::new(
                    exit::CANNOT_WRITE,
                    format!("cannot write the man pages into {}: {e}", dir.display()),
                )
            })?;
            if let Ok(entries) = std::fs::read_dir(dir) {
                let mut pages: Vec<String> = entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with("redlock") && n.ends_with(".1"))
                    .collect();
                pages.sort();
                say!("redlock: wrote {} into {}", pages.join(", "), dir.display());
            }
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut page)
                .map_err(|e| Fail::new(exit::INTERNAL, format!("cannot render: {e}")))?;
            let mut stdout = std::io::stdout().lock();
            std::io::Write::write_all(&mut stdout, &page)
                .and_then(|()| std::io::Write::flush(&mut stdout))
                .map_err(|e| Fail::new(exit::INTERNAL, format!("cannot write to stdout: {e}")))?;
        }
    }
    Ok(exit::OK)
}
