//! Bounds on a YAML file (a catalog, a shadow candidate, a catalog test file) checked before any
//! parser sees it: its size, read without taking more, and how deeply its collections nest,
//! counted in one pass over the text without recursion. The YAML parser's cost grows faster than
//! the text with nesting — flow collections (`[[[…`, `{a: {a: …`) are quadratic in libyaml's
//! scanner: 20,000 levels took 9 s, 100,000 (a 200 KB file) over a minute — so a file past these
//! bounds is refused unparsed, with an error naming the bound.
//!
//! The depth counted is the parser's, or a little more: every indentation level of block context,
//! every compact entry that opens a collection on its line (`- - x`, `? …`), and every flow bracket
//! outside quoted scalars, comments and block scalars. Quotes count only where YAML starts a quoted
//! scalar (an apostrophe inside a plain scalar is text), as the parser reads them.

use std::{io::Read, path::Path};

/// The largest YAML file read: 16 MiB, room for a catalog of 10,000 tools (~4.5 MB, the
/// decision benchmark's largest) several times over; parsing is linear in size, unlike depth.
pub const MAX_YAML_BYTES: usize = 16 * 1024 * 1024;
/// The deepest nesting of collections accepted. A catalog's deepest part is usually an input
/// schema, a few levels of `properties`; the YAML deserializer stops at 128 anyway.
pub const MAX_YAML_DEPTH: usize = 128;

/// Why a YAML file was not read, or its text is refused unparsed.
#[derive(Debug, thiserror::Error)]
pub enum BoundsError {
    /// The file cannot be opened or read.
    #[error("cannot read file: {0}")]
    Unreadable(#[source] std::io::Error),
    /// The file is not text.
    #[error("cannot read file: not UTF-8 ({0})")]
    NotUtf8(#[source] std::string::FromUtf8Error),
    /// Past [`MAX_YAML_BYTES`].
    #[error(
        "the file is over {} MiB; at most {} bytes are read",
        MAX_YAML_BYTES >> 20,
        MAX_YAML_BYTES
    )]
    TooLarge,
    /// Collections nested past [`MAX_YAML_DEPTH`], first at this 1-based line.
    #[error(
        "line {line}: collections nested more than {max} levels deep; at most {max} are accepted (counted before parsing)",
        max = MAX_YAML_DEPTH
    )]
    TooDeep { line: usize },
}

/// Reads a YAML file of at most [`MAX_YAML_BYTES`], taking no more than one byte past the bound
/// from a file that is larger (or grows while read).
pub fn read_bounded(path: &Path) -> Result<String, BoundsError> {
    let file = std::fs::File::open(path).map_err(BoundsError::Unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_YAML_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(BoundsError::Unreadable)?;
    if bytes.len() > MAX_YAML_BYTES {
        return Err(BoundsError::TooLarge);
    }
    String::from_utf8(bytes).map_err(BoundsError::NotUtf8)
}

/// Checks `text` against both bounds; the error says which and where.
pub fn check(text: &str) -> Result<(), BoundsError> {
    if text.len() > MAX_YAML_BYTES {
        return Err(BoundsError::TooLarge);
    }
    match deeper_than(text, MAX_YAML_DEPTH) {
        Some(line) => Err(BoundsError::TooDeep { line }),
        None => Ok(()),
    }
}

/// The 1-based line at which collections nest deeper than `max`, if they do.
fn deeper_than(text: &str, max: usize) -> Option<usize> {
    let mut scan = Scan::default();
    for (n, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line).as_bytes();
        if scan.line(line, max) {
            return Some(n + 1);
        }
    }
    None
}

#[derive(Default)]
struct Scan {
    /// Indentations of the enclosing block collections, innermost last (at most `max` + 1).
    indents: Vec<usize>,
    /// Open flow collections, and the block depth they were opened at.
    flow: usize,
    flow_base: usize,
    /// Inside a quoted scalar (it may span lines): its quote.
    quote: Option<u8>,
    /// Inside a block scalar (`|`, `>`): the indentation of the line that opened it. Its content
    /// is text, whatever it looks like.
    block_scalar: Option<usize>,
    /// The next character that is not a space begins a node (where quotes and brackets count).
    node_start: bool,
}

fn is_blank(b: Option<&u8>) -> bool {
    matches!(b, None | Some(b' ' | b'\t'))
}

impl Scan {
    /// Scans one line; true when nesting went past `max`.
    fn line(&mut self, bytes: &[u8], max: usize) -> bool {
        let mut i = 0;
        let mut depth = self.flow_base;
        if self.quote.is_none() && self.flow == 0 {
            let indent = bytes.iter().take_while(|b| **b == b' ').count();
            let rest = bytes[indent..].trim_ascii_start();
            let empty = rest.is_empty() || rest[0] == b'#';
            if let Some(opened_at) = self.block_scalar {
                if empty || indent > opened_at {
                    return false;
                }
                self.block_scalar = None;
            }
            if empty {
                return false;
            }
            i = indent;
            if indent == 0
                && (bytes.starts_with(b"---") || bytes.starts_with(b"..."))
                && is_blank(bytes.get(3))
            {
                // A new document starts from nothing.
                self.indents.clear();
                i = 3;
            } else {
                while self.indents.last().is_some_and(|&last| last > indent) {
                    self.indents.pop();
                }
                if self.indents.last() != Some(&indent) {
                    self.indents.push(indent);
                }
            }
            depth = self.indents.len();
            // Compact entries and node properties (anchors, tags) before the line's node.
            loop {
                while is_blank(bytes.get(i)) && i < bytes.len() {
                    i += 1;
                }
                match bytes.get(i) {
                    Some(b'&' | b'!') => {
                        while i < bytes.len() && !is_blank(bytes.get(i)) {
                            i += 1;
                        }
                    }
                    Some(b'-' | b'?') if is_blank(bytes.get(i + 1)) => {
                        depth += 1;
                        i += 1;
                    }
                    _ => break,
                }
            }
            if depth > max {
                return true;
            }
            self.node_start = true;
        }
        while i < bytes.len() {
            let c = bytes[i];
            let next = bytes.get(i + 1);
            if let Some(quote) = self.quote {
                match (quote, c) {
                    (b'\'', b'\'') if next == Some(&b'\'') => i += 1,
                    (b'"', b'\\') => i += 1,
                    (b'\'', b'\'') | (b'"', b'"') => self.quote = None,
                    _ => {}
                }
                i += 1;
                continue;
            }
            match c {
                b' ' | b'\t' => {}
                b'#' if i == 0 || is_blank(bytes.get(i - 1)) => break,
                b'\'' | b'"' if self.node_start => {
                    self.quote = Some(c);
                    self.node_start = false;
                }
                b'[' | b'{' if self.flow > 0 || self.node_start => {
                    if self.flow == 0 {
                        self.flow_base = depth;
                    }
                    self.flow += 1;
                    if self.flow_base + self.flow > max {
                        return true;
                    }
                    self.node_start = true;
                }
                b']' | b'}' if self.flow > 0 => {
                    self.flow -= 1;
                    self.node_start = false;
                }
                b',' if self.flow > 0 => self.node_start = true,
                b':' if is_blank(next)
                    || (self.flow > 0
                        && matches!(next, Some(b',' | b'[' | b']' | b'{' | b'}'))) =>
                {
                    self.node_start = true;
                }
                b'&' | b'!' if self.node_start => {
                    while i + 1 < bytes.len() && !is_blank(bytes.get(i + 1)) {
                        i += 1;
                    }
                }
                b'?' if self.node_start && is_blank(next) => {}
                b'|' | b'>' if self.node_start && self.flow == 0 => {
                    let indent = bytes.iter().take_while(|b| **b == b' ').count();
                    self.block_scalar = Some(indent);
                    break;
                }
                _ => self.node_start = false,
            }
            i += 1;
        }
        if self.flow == 0 {
            self.flow_base = 0;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(text: &str, max: usize) -> bool {
        deeper_than(text, max).is_none()
    }

    #[test]
    fn flow_nesting_is_counted() {
        let deep = format!("a: {}{}\n", "[".repeat(10), "]".repeat(10));
        assert!(depth_ok(&deep, 11));
        assert!(!depth_ok(&deep, 10));
        let maps = format!("a: {}1{}\n", "{b: ".repeat(10), "}".repeat(10));
        assert!(depth_ok(&maps, 11) && !depth_ok(&maps, 10));
        // Spread over lines, with commas and comments.
        let lines = "a: [\n  [1, [2,\n    # ] not a bracket\n    [3]]],\n  4]\nb: [[[x]]]\n";
        assert!(depth_ok(lines, 5) && !depth_ok(lines, 4));
    }

    #[test]
    fn block_nesting_is_counted() {
        let compact = format!("a:\n  {}x\n", "- ".repeat(20));
        assert!(depth_ok(&compact, 22) && !depth_ok(&compact, 21));
        let mut indented = String::new();
        for level in 0..20 {
            indented += &format!("{}k{level}:\n", " ".repeat(level));
        }
        indented += &format!("{}v: 1\n", " ".repeat(20));
        assert!(depth_ok(&indented, 21) && !depth_ok(&indented, 20));
        // Anchors and tags between compact entries do not hide them.
        let tagged = format!("a:\n{}x\n", "- &n !!seq ".repeat(20));
        assert!(!depth_ok(&tagged, 20));
    }

    #[test]
    fn brackets_that_are_text_do_not_count() {
        let text = concat!(
            "a: \"[[[[[[[[\"\n",
            "b: '[[[[[[ it''s ]]'\n",
            "c: see [1] and [[2\n",
            "d: the caller's [[[[ tickets\n",
            "e: |\n  [[[[[[[[\n  - - - - - -\n",
            "f: >-\n  {{{{{{{{\n",
            "g: x # [[[[[[[[\n",
            "h: \"multi [[[[\n  line [[[[\"\n",
        );
        assert!(depth_ok(text, 2), "{:?}", deeper_than(text, 2));
    }

    #[test]
    fn quotes_cannot_hide_nesting() {
        // A quote in flow context starts a scalar only at a node's start; inside a plain scalar it
        // is text, as the parser reads it, so it cannot swallow the brackets after it.
        let sneaky = format!(
            "a: it's {}\nb: {}{}\n",
            "[".repeat(3),
            "[".repeat(50),
            "]".repeat(50)
        );
        assert!(!depth_ok(&sneaky, 40));
        let closers = format!("a: {}\n", "[ \"]]]]\", ".repeat(50));
        assert!(!depth_ok(&closers, 40));
    }

    #[test]
    fn the_demo_and_examples_are_well_within_bounds() {
        for text in [
            crate::settings::DEMO_CATALOG,
            include_str!("../../examples/http.yaml"),
            include_str!("../../examples/process.yaml"),
            include_str!("../../examples/mcp.yaml"),
            include_str!("../../examples/demo.tests.yaml"),
        ] {
            assert!(depth_ok(text, 16), "{:?}", deeper_than(text, 16));
            assert!(check(text).is_ok());
        }
    }

    #[test]
    fn the_size_bound_is_checked_before_anything_else() {
        let big = "#".repeat(MAX_YAML_BYTES + 1);
        assert!(check(&big).unwrap_err().to_string().contains("16 MiB"));
    }
}
