//! Build-time tool (not shipped): writes the manifest of a staged package
//! tree. `integration/package` runs it once per package, after staging and
//! before building the rpm/deb, and installs its output at
//! `/usr/share/gpuq/manifests/<package>.json`.
//!
//! gpuq-manifest --package NAME --version V --root STAGING [--config /etc/...]... --out FILE

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("gpuq-manifest: {msg}");
            ExitCode::from(2)
        }
    }
}

fn need<T>(v: Option<T>, name: &str) -> Result<T, String> {
    v.ok_or(format!("{name} is required"))
}

fn run(args: Vec<String>) -> Result<(), String> {
    let (mut package, mut version, mut root, mut out) = (None, None, None, None);
    let mut config = Vec::new();
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--package" => package = Some(value()?),
            "--version" => version = Some(value()?),
            "--root" => root = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--config" => config.push(value()?),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: gpuq-manifest --package NAME --version V --root DIR [--config PATH]... --out FILE"
                ))
            }
        }
    }
    let (package, version, root, out) = (
        need(package, "--package")?,
        need(version, "--version")?,
        need(root, "--root")?,
        need(out, "--out")?,
    );
    if out.starts_with(&root) {
        return Err(format!(
            "--out {} must be outside the staged tree (the manifest cannot list itself)",
            out.display()
        ));
    }
    let m = gpuq_manifest::Manifest::from_tree(&root, &package, &version, &config)
        .map_err(|e| e.to_string())?;
    std::fs::write(&out, m.to_json()).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(())
}
