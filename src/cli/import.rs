//! `toolgate import openapi`: catalog entries from an OpenAPI description, printed for a person
//! to review and commit (docs/openapi.md). Operations left out are listed on stderr with why, and
//! as comments in the output.

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
            openapi::ImportError::TooLarge(size as usize).to_string(),
        ));
    }
    let text = std::fs::read_to_string(spec).map_err(|err| fail(err.to_string()))?;
    let document = openapi::parse(&text).map_err(|err| fail(err.to_string()))?;
    let imported =
        openapi::import(&document, upstream, selection).map_err(|err| fail(err.to_string()))?;
    let yaml = serde_yaml_ng::to_string(&serde_json::json!({ "tools": imported.tools }))
        .map_err(|err| fail(err.to_string()))?;
    println!(
        "# {} of {} ({}), imported by `toolgate import openapi` for upstream {upstream}.",
        operations(imported.tools.len()),
        imported.title,
        spec.display()
    );
    println!("# Review each entry (its risk level above all) before committing it to the catalog.");
    for (operation, why) in &imported.skipped {
        println!("# not imported: {operation}: {why}");
        eprintln!("not imported: {operation}: {why}");
    }
    print!("{yaml}");
    eprintln!(
        "{} imported, {} not imported",
        operations(imported.tools.len()),
        imported.skipped.len()
    );
    Ok(())
}

fn operations(n: usize) -> String {
    format!("{n} operation{}", if n == 1 { "" } else { "s" })
}
