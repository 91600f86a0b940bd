//! `toolgate import openapi`: catalog entries from an OpenAPI description, printed for a person
//! to review and commit (docs/openapi.md). Entries are printed as they are made; operations left
//! out are listed after them, as comments and on stderr, with why.

use std::path::Path;

use super::Failure;
use crate::openapi::{self, Selection};

pub(super) fn openapi(spec: &Path, upstream: &str, selection: &Selection) -> Result<(), Failure> {
    let fail = |what: String| Failure::error(format_args!("{}: {what}", spec.display()));
    let size = std::fs::metadata(spec)
        .map_err(|err| fail(err.to_string()))?
        .len();
    if size > openapi::MAX_SPEC_BYTES as u64 {
        return Err(fail(
            openapi::ImportError::TooLarge(usize::try_from(size).unwrap_or(usize::MAX)).to_string(),
        ));
    }
    let text = std::fs::read_to_string(spec).map_err(|err| fail(err.to_string()))?;
    let document = openapi::parse(&text).map_err(|err| fail(err.to_string()))?;
    drop(text);
    println!(
        "# Imported from {} by `toolgate import openapi` for upstream {upstream}. Review each entry",
        spec.display()
    );
    println!("# (its risk level above all) before committing it to the catalog.");
    println!("tools:");
    let mut failed = None;
    let imported = openapi::import_each(&document, upstream, selection, &mut |tool| {
        if failed.is_some() {
            return;
        }
        match serde_yaml_ng::to_string(&[tool]) {
            Ok(yaml) => print!("{yaml}"),
            Err(err) => failed = Some(err.to_string()),
        }
    })
    .map_err(|err| fail(err.to_string()))?;
    if let Some(err) = failed {
        return Err(fail(err));
    }
    println!(
        "# {} of {} imported.",
        operations(imported.count),
        imported.title
    );
    for (operation, why) in &imported.skipped {
        println!("# not imported: {operation}: {why}");
        eprintln!("not imported: {operation}: {why}");
    }
    eprintln!(
        "{} imported, {} not imported",
        operations(imported.count),
        imported.skipped.len()
    );
    Ok(())
}

fn operations(n: usize) -> String {
    format!("{n} operation{}", if n == 1 { "" } else { "s" })
}
