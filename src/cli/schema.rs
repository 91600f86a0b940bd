//! `toolgate schema`: the JSON Schema of the catalog file format, or with `--tests` of the
//! `toolgate test` file format.

use super::{Failure, test_runner};

/// Prints the schema, pretty-printed.
pub(super) fn schema(tests: bool) -> Result<(), Failure> {
    let schema = match tests {
        true => test_runner::json_schema(),
        false => crate::settings::json_schema(),
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&schema).unwrap_or_default()
    );
    Ok(())
}
