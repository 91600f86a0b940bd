//! Catalog loading on arbitrary text: `Config::from_yaml` returns Ok or a `ConfigError` naming a
//! path and a message, and never panics. Seeds: the demo and the example catalogs.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use toolgate::{config::Config, settings::Env};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_yaml(text, "fuzz", Path::new("."), &Env::default()) {
        Ok(config) => {
            // A catalog that loads has a stable revision and only well-formed tool names.
            assert_eq!(config.catalog.revision().len(), 32);
            assert!(config.catalog.names().all(|n| !n.is_empty()));
        }
        Err(err) => {
            assert_eq!(err.file, "fuzz");
            assert!(
                !err.message.is_empty(),
                "an error without a message: {err:?}"
            );
        }
    }
});
