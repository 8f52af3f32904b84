//! Build-time generator (not shipped): the `gpuq` shell completions and man
//! pages, from the same clap definitions the command parses with
//! (`gpuq_cli::Cli`). `integration/package` runs it and installs what it
//! writes; nothing here is a `gpuq` verb.
//!
//! cargo run -p gpuq-cli --example gpuq-gen-docs -- OUTDIR
//!
//! OUTDIR/completions/{gpuq.bash,_gpuq,gpuq.fish}
//! OUTDIR/man/gpuq.1 and gpuq-<verb>.1 for every verb

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("gpuq-gen-docs: usage: gpuq-gen-docs OUTDIR");
        return ExitCode::from(2);
    };
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuq-gen-docs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn generate(out: &Path) -> std::io::Result<()> {
    let comp = out.join("completions");
    let man = out.join("man");
    std::fs::create_dir_all(&comp)?;
    std::fs::create_dir_all(&man)?;
    let mut cmd = gpuq_cli::Cli::command();
    // The file names each shell looks for: bash-completion loads
    // completions/gpuq (installed under that name), zsh `_gpuq`, fish
    // `gpuq.fish`.
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, "gpuq", &comp)?;
    }
    // gpuq.1 and one page per verb (gpuq-submit.1, ...), as git does.
    clap_mangen::generate_to(cmd, &man)?;
    // clap_mangen also writes a page per `gpuq help VERB`, which says
    // nothing the verb's own page does not: not shipped.
    for e in std::fs::read_dir(&man)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name == "gpuq-help.1" || name.starts_with("gpuq-help-") {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}
