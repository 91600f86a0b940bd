//! Catalog loading: every load error names the file, the path inside it and what is wrong.

use std::{path::Path, process::Command};

use toolgate::{
    config::Config,
    settings::{ConfigError, Env},
};

/// A small valid catalog; each test breaks one thing.
const BASE: &str = r#"version: 1
identity: { dev_identity: true }
tenants:
  acme: {}
tools:
  - name: echo
    description: Returns text.
    risk_level: read_only
    timeout: 5s
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } } }
"#;

fn load(yaml: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(yaml, "catalog.yaml", Path::new("."), &Env::default())
}

fn error(yaml: &str) -> ConfigError {
    load(yaml).expect_err("should be refused")
}

fn assert_error(yaml: &str, path: &str, says: &str) {
    let err = error(yaml);
    assert_eq!(err.file, "catalog.yaml");
    assert_eq!(err.path, path, "{err}");
    assert!(err.message.contains(says), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("catalog.yaml: {path}: ")),
        "{err}"
    );
}

#[test]
fn the_base_catalog_loads() {
    assert!(load(BASE).is_ok());
}

#[test]
fn an_invalid_schema_is_refused() {
    assert_error(
        &BASE.replace("{ text: { type: string } }", "{ text: { type: strng } }"),
        "tools[0].input_schema",
        "invalid JSON Schema",
    );
}

#[test]
fn a_duplicate_name_and_version_is_refused() {
    let tool = &BASE[BASE.find("  - name: echo").unwrap()..];
    assert_error(
        &format!("{BASE}{tool}"),
        "tools[1].version",
        "duplicate tool \"echo\" version \"1\"",
    );
}

#[test]
fn an_unknown_executor_is_refused() {
    assert_error(
        &BASE.replace("builtin: echo", "builtin: ech0"),
        "tools[0].executor.builtin",
        "unknown builtin tool \"ech0\"",
    );
    assert_error(
        &BASE.replace("{ builtin: echo }", "{ shell: ls }"),
        "tools[0].executor.shell",
        "unknown field `shell`",
    );
}

#[test]
fn a_pattern_matching_no_tool_is_refused() {
    assert_error(
        &BASE.replace("acme: {}", "acme: { deny: [\"ticket_*\"] }"),
        "tenants.acme.deny[0]",
        "matches no tool",
    );
    assert_error(
        &format!("{BASE}agents:\n  bot: {{ allow: [\"ech\"] }}\n"),
        "agents.bot.allow[0]",
        "matches no tool",
    );
}

#[test]
fn a_bad_duration_is_refused() {
    assert_error(
        &BASE.replace("timeout: 5s", "timeout: 5 parsecs"),
        "tools[0].timeout",
        "invalid duration",
    );
}

#[test]
fn unknown_fields_and_versions_are_refused() {
    assert_error(
        &BASE.replace(
            "risk_level: read_only",
            "risk_level: read_only\n    risk: high",
        ),
        "tools[0].risk",
        "unknown field `risk`",
    );
    assert_error(
        &BASE.replace("version: 1", "version: 2"),
        "version",
        "unsupported config version 2",
    );
    assert_error(
        &BASE.replace("read_only", "harmless"),
        "tools[0].risk_level",
        "unknown variant `harmless`",
    );
}

#[test]
fn bindings_must_name_declared_properties() {
    let yaml = BASE.replace(
        "    input_schema:",
        "    bind: { filter.tenant: \"${caller.tenant}\" }\n    input_schema:",
    );
    assert_error(&yaml, "tools[0].bind.filter.tenant", "declares no property");
}

#[test]
fn a_catalog_without_identity_is_refused() {
    assert_error(
        &BASE.replace("identity: { dev_identity: true }\n", ""),
        "identity",
        "no way to identify callers",
    );
}

#[test]
fn check_exits_zero_for_valid_and_non_zero_naming_the_error_for_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&good, BASE).unwrap();
    std::fs::write(&bad, BASE.replace("timeout: 5s", "timeout: soon")).unwrap();
    let run = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .arg("check")
            .arg("--config")
            .arg(path)
            .output()
            .unwrap()
    };
    let ok = run(&good);
    assert!(ok.status.success(), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout).contains("ok (1 tools"));
    let failed = run(&bad);
    assert_eq!(failed.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: tools[0].timeout: invalid duration",
            bad.display()
        )),
        "{stderr}"
    );
    let missing = run(&dir.path().join("nope.yaml"));
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read file"));
}

#[test]
fn the_embedded_demo_and_every_example_pass_check() {
    let demo = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("check")
        .output()
        .unwrap();
    assert!(demo.status.success(), "{demo:?}");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        // `*.tests.yaml` are `toolgate test` files, not catalogs (catalog_tests.rs runs them).
        let is_tests = path.to_string_lossy().ends_with(".tests.yaml");
        if path.extension().is_some_and(|e| e == "yaml") && !is_tests {
            let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
                .arg("check")
                .arg("--config")
                .arg(&path)
                .env("BILLING_API_TOKEN", "example-token")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "demo, http, process and mcp examples: {checked}"
    );
}

#[test]
fn the_published_config_schema_is_current_and_accepts_the_demo() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.schema.json");
    let generated =
        serde_json::to_string_pretty(&toolgate::settings::json_schema()).unwrap() + "\n";
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == generated,
        "docs/config.schema.json is stale: run `UPDATE_SCHEMA=1 cargo test the_published_config_schema`"
    );
    // The schema really describes the format: the demo validates against it.
    let schema: serde_json::Value = serde_json::from_str(&published).unwrap();
    let demo: serde_json::Value =
        serde_yaml_ng::from_str(toolgate::settings::DEMO_CATALOG).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&demo)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn the_boundary_page_documents_every_error_type_with_its_status() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/boundary.md"))
            .unwrap();
    for reason in toolgate::error::Reason::ALL {
        let row = format!("| `{}` | `{}` |", reason.status().as_str(), reason.code());
        assert!(
            page.contains(&row),
            "docs/boundary.md lacks the row starting {row}"
        );
    }
}
