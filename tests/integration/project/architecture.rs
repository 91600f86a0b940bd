//! The module floors `src/lib.rs` writes down hold in the code: outside test code, no module
//! names a module on a higher floor (but the one designed exception the floors table names:
//! executors take `boundary::Permit`, which closes no loop below the boundary), and no
//! top-level modules import each other around a loop. The floors are read from `src/lib.rs` itself, so the doc and the check cannot drift.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// The one import that goes up: (from, to, the only item it may name).
const EXCEPTION: (&str, &str, &str) = ("executor", "boundary", "Permit");

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Module -> floor, from the `# Floors` table of `src/lib.rs`'s doc.
fn floors() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut floors = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! | ") else {
            continue;
        };
        let cells: Vec<&str> = row.split(" | ").collect();
        let Ok(floor) = cells[0].trim().parse::<usize>() else {
            continue;
        };
        for module in cells[1].split(',') {
            floors.insert(module.trim().trim_matches('`').to_owned(), floor);
        }
    }
    floors
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/boundary/mod.rs` -> `boundary`).
fn module_of(path: &Path) -> String {
    let relative = path.strip_prefix(src()).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_owned()
}

/// Whether a file is a module's unit tests in a file of their own (`#[cfg(test)] mod tests;`).
fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == "tests.rs")
        && std::fs::read_to_string(path.with_file_name("mod.rs"))
            .is_ok_and(|parent| parent.contains("#[cfg(test)]\nmod tests;"))
}

/// The code of a file without its inline test module and comments.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a `crate::` path names at its first step: each top-level module, with the item after it
/// (`crate::boundary::Permit` -> ("boundary", "Permit"); `crate::{a::b, c}` -> both).
fn imports(code: &str) -> Vec<(String, String)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the braces: split on commas outside nested braces.
            let (mut depth, mut item, mut items) = (0usize, String::new(), Vec::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ => {}
                }
                item.push(c);
            }
            items.push(item);
            for item in items {
                let item = item.trim_start_matches(',').trim();
                let module = ident(item);
                if module.is_empty() {
                    continue; // after a trailing comma
                }
                let next = item[module.len()..].trim_start_matches("::");
                found.push((module, ident(next.trim_start_matches('{').trim())));
            }
        } else {
            let module = ident(rest);
            let next = rest[module.len()..].trim_start_matches("::");
            found.push((module, ident(next)));
        }
    }
    found
}

#[test]
fn no_module_imports_a_higher_floor_and_none_import_each_other_around_a_loop() {
    let floors = floors();
    assert!(floors.len() >= 20, "the floors table: {floors:?}");
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    let mut exception_used = false;
    for path in &all {
        let module = module_of(path);
        if module == "lib" || module == "main" || is_test_file(path) {
            continue;
        }
        let floor = *floors
            .get(&module)
            .unwrap_or_else(|| panic!("module {module} is on no floor of src/lib.rs"));
        let text = std::fs::read_to_string(path).unwrap();
        for (to, item) in imports(&code(&text)) {
            let Some(&to_floor) = floors.get(&to) else {
                continue; // `crate::proto` and the like
            };
            if to == module {
                continue;
            }
            if (module.as_str(), to.as_str(), item.as_str()) == EXCEPTION {
                exception_used = true;
                continue;
            }
            if to_floor > floor {
                upward.push(format!(
                    "{} (floor {floor}) imports {to}::{item} (floor {to_floor})",
                    path.display()
                ));
            }
            graph.entry(module.clone()).or_default().insert(to);
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a lower floor:\n{}",
        upward.join("\n")
    );
    assert!(
        exception_used,
        "the executors no longer take boundary::Permit: drop the exception"
    );
    // The exception closes no loop below the boundary: nothing on the executors' floor or lower
    // both is used by the boundary and uses the executors (as the catalog did while a tool held
    // its live HTTP client).
    let (from, to, _) = EXCEPTION;
    let reachable_from = |start: &str, graph: &BTreeMap<String, BTreeSet<String>>| {
        let mut seen = BTreeSet::new();
        let mut next = vec![start.to_owned()];
        while let Some(node) = next.pop() {
            for onward in graph.get(&node).into_iter().flatten() {
                if seen.insert(onward.clone()) {
                    next.push(onward.clone());
                }
            }
        }
        seen
    };
    let mut reversed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, imports) in &graph {
        for imported in imports {
            reversed
                .entry(imported.clone())
                .or_default()
                .insert(module.clone());
        }
    }
    let used_by_the_boundary = reachable_from(to, &graph);
    let loop_below: Vec<_> = reachable_from(from, &reversed)
        .intersection(&used_by_the_boundary)
        .filter(|m| m.as_str() != from && floors[m.as_str()] <= floors[from])
        .cloned()
        .collect();
    assert!(
        loop_below.is_empty(),
        "{to} uses these modules, which use {from}: {from} -> {to}::{} closes a loop through them: {loop_below:?}",
        EXCEPTION.2
    );
    // No loops, within a floor or across.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        let cycle = visit(module, &graph, &mut Vec::new(), &mut done);
        assert!(cycle.is_none(), "modules import each other: {cycle:?}");
    }
}

#[test]
fn the_import_reader_finds_what_it_must() {
    let code = "use crate::{\n    audit::{AuditEvent, Party},\n    boundary::Permit,\n    clock,\n};\nlet x = crate::shadow::Shadow::new();";
    assert_eq!(
        imports(code),
        [
            ("audit".to_owned(), "AuditEvent".to_owned()),
            ("boundary".to_owned(), "Permit".to_owned()),
            ("clock".to_owned(), String::new()),
            ("shadow".to_owned(), "Shadow".to_owned()),
        ]
    );
}
