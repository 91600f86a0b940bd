//! The documentation holds together: every relative link and `#anchor` in the README, `docs/`,
//! `deploy/README.md` and the client READMEs names a file of the repository and, for an anchor, a
//! heading of that file as GitHub slugs it; and every page in `docs/` is in its index. The pages
//! are read with a CommonMark parser (pulldown-cmark), so what GitHub renders as a link is what is
//! checked, and brackets in code are not.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The pages whose links are checked, relative to the root: the README, every Markdown file in
/// `docs/`, and the other READMEs a reader reaches from them.
fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = [
        "README.md",
        "deploy/README.md",
        "clients/python/README.md",
        "clients/typescript/README.md",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| Path::new("docs").join(path.file_name().expect("a file name")))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// GitHub's anchor for a heading's text (github-slugger): lowercased, every character that is
/// not a letter, a digit, `-`, `_` or a space removed, and each space made a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// What a page offers and asks: its headings' anchors, and its links (line, destination).
#[derive(Default)]
struct Page {
    anchors: HashSet<String>,
    links: Vec<(usize, String)>,
}

fn parse(text: &str) -> Page {
    let mut page = Page::default();
    let mut heading: Option<String> = None;
    let mut seen: HashMap<String, usize> = HashMap::new();
    let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                let line = text[..range.start].matches('\n').count() + 1;
                page.links.push((line, dest_url.into_string()));
            }
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(text) | Event::Code(text) => {
                if let Some(heading) = &mut heading {
                    heading.push_str(&text);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                // A repeated heading gets `-1`, `-2`, … as on GitHub.
                let count = seen.entry(base.clone()).or_insert(0);
                let anchor = match *count {
                    0 => base.clone(),
                    n => format!("{base}-{n}"),
                };
                *count += 1;
                page.anchors.insert(anchor);
            }
            _ => {}
        }
    }
    page
}

/// Whether a destination leaves the repository (a URL with a scheme, or mail).
fn is_external(destination: &str) -> bool {
    destination.starts_with("http://")
        || destination.starts_with("https://")
        || destination.starts_with("mailto:")
}

/// Every link of the page at `path` (relative to `root`) that does not resolve, as
/// `path:line: destination: what is wrong`; and how many links were checked.
fn broken_links(root: &Path, path: &Path) -> (Vec<String>, usize) {
    let read = |path: &Path| std::fs::read_to_string(root.join(path));
    let text = read(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let page = parse(&text);
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    let mut checked = 0;
    for (line, destination) in &page.links {
        if is_external(destination) {
            continue;
        }
        checked += 1;
        let (file, anchor) = match destination.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (destination.as_str(), None),
        };
        let mut problem = |what: String| {
            broken.push(format!("{}:{line}: {destination}: {what}", path.display()));
        };
        if file.starts_with('/') {
            problem("an absolute path, which GitHub resolves against its own site".into());
            continue;
        }
        let target = if file.is_empty() {
            path.to_path_buf()
        } else {
            dir.join(file)
        };
        if !root.join(&target).exists() {
            problem(format!("{} does not exist", target.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if target.extension().is_none_or(|ext| ext != "md") {
            problem(format!(
                "an anchor into {}, which has no headings",
                target.display()
            ));
            continue;
        }
        let anchors = match file.is_empty() {
            true => page.anchors.clone(),
            false => match read(&target) {
                Ok(text) => parse(&text).anchors,
                Err(err) => {
                    problem(format!("{}: {err}", target.display()));
                    continue;
                }
            },
        };
        if !anchors.contains(anchor) {
            let mut known: Vec<&String> = anchors.iter().collect();
            known.sort();
            problem(format!(
                "no heading of {} has the anchor #{anchor} (it has {known:?})",
                target.display()
            ));
        }
    }
    (broken, checked)
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let (mut page_broken, page_checked) = broken_links(&root, &page);
        broken.append(&mut page_broken);
        checked += page_checked;
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // The README alone links to every page of docs/: a parser that found no links would pass
    // the check above with nothing checked.
    assert!(checked >= 50, "only {checked} relative links found");
}

#[test]
fn every_page_of_docs_is_in_its_index() {
    let index = parse(&std::fs::read_to_string(root().join("docs/README.md")).unwrap());
    let listed: HashSet<&str> = index
        .links
        .iter()
        .map(|(_, destination)| destination.split('#').next().unwrap_or_default())
        .collect();
    let missing: Vec<String> = pages()
        .iter()
        .filter(|page| page.starts_with("docs") && !page.ends_with("README.md"))
        .map(|page| page.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| !listed.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/README.md does not list {missing:?}"
    );
}

#[test]
fn anchors_are_slugged_as_github_slugs_them() {
    // Each from a heading of these pages, with the anchor GitHub gives it.
    for (heading, anchor) in [
        (
            "Statuses and `error_type` codes",
            "statuses-and-error_type-codes",
        ),
        (
            "Traces (OpenTelemetry → Jaeger)",
            "traces-opentelemetry--jaeger",
        ),
        (
            "Shared state: more than one replica (components/redis)",
            "shared-state-more-than-one-replica-componentsredis",
        ),
        ("LangChain.js", "langchainjs"),
        (
            "Kept between calls (gauge in `/metrics`)",
            "kept-between-calls-gauge-in-metrics",
        ),
        (
            "What a Redis costs per 1,000 tenants",
            "what-a-redis-costs-per-1000-tenants",
        ),
    ] {
        let page = parse(&format!("# {heading}\n"));
        assert_eq!(
            page.anchors,
            HashSet::from([anchor.to_owned()]),
            "{heading}"
        );
    }
    // A repeated heading is numbered; links in code are not links.
    let page = parse("## Go\n\n## Go\n\n`[not](a-link.md)`\n\n```\n[nor](this.md)\n```\n");
    assert_eq!(
        page.anchors,
        HashSet::from(["go".to_owned(), "go-1".to_owned()])
    );
    assert!(page.links.is_empty(), "{:?}", page.links);
}

#[test]
fn a_broken_link_or_anchor_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(
        dir.path().join("docs/other.md"),
        "# Other page\n\n## A section\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("docs/page.md"),
        "# Page\n\n\
         [fine](other.md), [fine too](other.md#a-section), [here](#page), [web](https://example.com)\n\n\
         [gone](missing.md), [wrong anchor](other.md#b-section), [not here](#nowhere)\n\n\
         | a | [in a table](../nothing.md) |\n|---|---|\n",
    )
    .unwrap();
    let (broken, checked) = broken_links(dir.path(), Path::new("docs/page.md"));
    assert_eq!(checked, 7);
    let expected = [
        "docs/page.md:5: missing.md: docs/missing.md does not exist",
        "docs/page.md:5: other.md#b-section: no heading of docs/other.md has the anchor #b-section",
        "docs/page.md:5: #nowhere: no heading of docs/page.md has the anchor #nowhere",
        "docs/page.md:7: ../nothing.md: docs/../nothing.md does not exist",
    ];
    assert_eq!(broken.len(), expected.len(), "{broken:#?}");
    for (found, expected) in broken.iter().zip(expected) {
        assert!(
            found.starts_with(expected),
            "{found}\nshould start with\n{expected}"
        );
    }
}

/// The rows of docs/boundary.md's table of the chain's stages: each row's number and the stage
/// its refusals name (`—` for none).
fn stage_table() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("docs/boundary.md")).unwrap();
    let header = "| # | stage (`refused_by`) | what it checks |";
    let start = text.find(header).expect("the stage table's header");
    text[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with("| "))
        .map(|line| {
            let cells: Vec<&str> = line.trim_start_matches("| ").split(" | ").collect();
            let stage = cells[1].split('`').nth(1).unwrap_or(cells[1]).trim();
            (cells[0].trim().to_owned(), stage.to_owned())
        })
        .collect()
}

#[test]
fn the_chain_s_steps_the_stages_and_the_docs_table_agree() {
    use toolgate::{boundary::Step, error::Stage};
    // The docs' table names every step of the chain, in its order, with the stage it refuses as.
    let steps: Vec<(String, String)> = Step::ALL
        .iter()
        .map(|step| {
            let stage = step.refused_as().map_or("—", Stage::as_str);
            (step.number().to_owned(), stage.to_owned())
        })
        .collect();
    assert_eq!(
        stage_table(),
        steps,
        "docs/boundary.md's table against Step"
    );
    // Stage's order is the chain's: each stage first refuses at the place Stage lists it.
    let mut first = Vec::new();
    for stage in Step::ALL.iter().filter_map(|step| step.refused_as()) {
        if !first.contains(&stage) {
            first.push(stage);
        }
    }
    assert_eq!(first, Stage::ALL, "Stage's order against the chain's");
}
