//! One file per subcommand: its options (a clap `Args` struct), its `--help` text, and the
//! function that carries it out and returns the exit code (or a [`Fail`](crate::fail::Fail)).

pub mod acquire;
pub mod bench;
pub mod completions;
pub mod demo;
pub mod extend;
pub mod man;
pub mod release;
pub mod repair_fences;
pub mod run;
pub mod servers;
pub mod status;
