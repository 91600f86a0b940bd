//! Micro-benchmarks of the decision path without I/O (docs/performance.md): each boundary stage a
//! call passes before its backend runs, per call, for catalogs of 10, 1,000 and 10,000 tools with
//! 1,000 tenants, plus caller identification and the whole synchronous chain in one.
//!
//! ```sh
//! cargo bench --bench decision            # all
//! cargo bench --bench decision -- access  # those whose name contains "access"
//! cargo bench --bench decision -- --test  # each once, as a smoke test
//! ```
//!
//! divan rather than criterion: far fewer dependencies to build on a small shared machine (no
//! plotting, no rayon, no serde stack of its own), `args = [..]` gives the catalog-size matrix in
//! one attribute, inputs made per sample keep clones out of the timing, and `--test` runs each
//! benchmark once so CI can keep it compiling and working. What criterion adds — saved baselines
//! and change detection — matters less here than the absolute per-call numbers.
//!
//! Calls rotate over 1,024 (tool, tenant) pairs spread through the catalog, so lookups are not
//! always answered from the same cache lines.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, like a test: a failure is a panic"
)]

use std::{
    path::Path,
    sync::{Arc, LazyLock},
};

use divan::{Bencher, black_box};
use futures::FutureExt;
use serde_json::Value;
use tonic::metadata::MetadataMap;
use toolgate::{
    boundary::{access, bind, quota_of, quota_plan, schema, scopes, structure},
    canonical,
    catalog::ToolVersion,
    clock::SharedClock,
    conditions::{CallFacts, Input, ToolFacts},
    config::Config,
    identity::{Caller, IdentityResolver},
    limits::{Cost, Quotas, RateLimits, metrics::QuotaMetrics},
    metrics::Metrics,
    settings::{Env, LimitsConfig, Rate},
    state,
};

fn main() {
    // Half a second per benchmark at least, so µs-scale stages get thousands of iterations;
    // the command line (e.g. --min-time, --sample-count) still overrides this.
    divan::Divan::default()
        .min_time(std::time::Duration::from_millis(500))
        .config_with_args()
        .main();
}

const SIZES: &[usize] = &[10, 1_000, 10_000];
const TENANTS: usize = 1_000;
/// (tool, tenant) pairs the benchmarks rotate over; a power of two.
const KEYS: usize = 1_024;

/// What the model sends: the bound `filter.tenant` is left out, as a well-behaved model does.
const ARGUMENTS: &str =
    r#"{"query":"refund policy for damaged items","top_k":3,"filter":{"lang":"en"}}"#;

/// A catalog of `tools` tools and 1,000 tenants in the shape real catalogs have: every tool has a
/// JSON Schema with a bound tenant filter, a required scope and a rate limit; every tenth has a
/// 10 % canary; every tenant has an overall rate limit and every tenth an allow and a deny list;
/// a global deny list and an agent allow list apply to all.
fn catalog_yaml(tools: usize) -> String {
    let mut yaml = String::from(
        "version: 1\nidentity: { dev_identity: true }\naudit: { sink: none }\n\
         policy:\n  deny: [\"admin_*\"]\nagents:\n  support-bot:\n    allow: [\"tool_*\"]\ntenants:\n",
    );
    for t in 0..TENANTS {
        if t % 10 == 0 {
            yaml.push_str(&format!(
                "  tenant-{t:04}: {{ rate_limit: 1000000/s, allow: [\"tool_*\"], deny: [\"tool_00001\"] }}\n"
            ));
        } else {
            yaml.push_str(&format!("  tenant-{t:04}: {{ rate_limit: 1000000/s }}\n"));
        }
    }
    yaml.push_str("tools:\n");
    let tool = |name: &str, version: &str, canary: &str| {
        format!(
            r#"  - name: {name}
    version: "{version}"{canary}
    description: Searches the knowledge base of the caller's company.
    risk_level: read_only
    required_scopes: ["kb:read"]
    rate_limit: 1000000/s
    executor: {{ builtin: echo_arguments }}
    input_schema:
      type: object
      properties:
        query: {{ type: string, minLength: 1, maxLength: 1000 }}
        top_k: {{ type: integer, minimum: 1, maximum: 10 }}
        filter:
          type: object
          properties:
            tenant: {{ type: string }}
            lang: {{ enum: [en, de, fr] }}
          required: [tenant]
      required: [query, filter]
      additionalProperties: false
    bind:
      filter.tenant: "${{caller.tenant}}"
"#
        )
    };
    for i in 0..tools {
        let name = format!("tool_{i:05}");
        yaml.push_str(&tool(&name, "1", ""));
        if i % 10 == 0 {
            yaml.push_str(&tool(
                &name,
                "2",
                "\n    status: canary\n    canary: { percent: 10 }",
            ));
        }
    }
    yaml.push_str(
        "  - name: admin_purge\n    description: Denied to everyone.\n    risk_level: destructive\n    \
         executor: { builtin: delete_ticket }\n    input_schema: { type: object }\n",
    );
    yaml
}

fn load(yaml: &str) -> Config {
    Config::from_yaml(yaml, "bench", Path::new("."), &Env::default())
        .unwrap_or_else(|e| panic!("bench catalog: {e}"))
}

/// A catalog with dev identity and nothing else, for the identity benchmarks.
const DEV_IDENTITY: &str = "version: 1\nidentity: { dev_identity: true }\n";

static DEV_RESOLVER: LazyLock<IdentityResolver> = LazyLock::new(|| {
    IdentityResolver::new(
        &load(DEV_IDENTITY).identity,
        SharedClock::system(),
        1 << 22,
        None,
    )
    .unwrap()
});

/// Dev identity metadata of a caller in `tenant`.
fn dev_metadata(tenant: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("x-toolgate-tenant", tenant.parse().expect("ascii"));
    metadata.insert("x-toolgate-subject", "alice".parse().expect("ascii"));
    metadata.insert("x-toolgate-agent", "support-bot".parse().expect("ascii"));
    metadata.insert(
        "x-toolgate-scopes",
        "kb:read,tickets:read".parse().expect("ascii"),
    );
    metadata
}

/// The caller as the dev identity resolver makes it (so new `Caller` fields need no change here).
fn caller(tenant: &str) -> Arc<Caller> {
    DEV_RESOLVER
        .resolve(dev_metadata(tenant).as_ref())
        .expect("dev identity")
}

/// One call's tool (resolved for its tenant) and caller.
struct Key {
    name: String,
    tool: Arc<ToolVersion>,
    caller: Arc<Caller>,
    tenant_rate: Option<Rate>,
}

struct Fixture {
    config: Config,
    rate_limits: RateLimits,
    /// The same limiter behind the enum the boundary calls (memory backend).
    quotas: Quotas,
    /// Budget spending; the bench catalog declares no budgets, so calls spend from none.
    budgets: toolgate::budgets::Budgets,
    keys: Vec<Key>,
    arguments: Value,
    arguments_budget: structure::ArgumentsBudget,
}

impl Fixture {
    fn build(tools: usize) -> Self {
        let config = load(&catalog_yaml(tools));
        let callers: Vec<Arc<Caller>> = (0..TENANTS)
            .map(|t| caller(&format!("tenant-{t:04}")))
            .collect();
        let keys = (0..KEYS)
            .map(|k| {
                // Spread over the catalog; tool_00001 is denied to some tenants, so skip it.
                let mut index = (k * 7_919) % tools;
                if index == 1 {
                    index = 2 % tools;
                }
                let name = format!("tool_{index:05}");
                let caller = callers[(k * 104_729) % TENANTS].clone();
                let tool = config
                    .catalog
                    .resolve(&name, None, &caller.tenant)
                    .expect("tool resolves")
                    .clone();
                let tenant_rate = config.catalog.tenant_rate(&caller.tenant);
                Key {
                    name,
                    tool,
                    caller,
                    tenant_rate,
                }
            })
            .collect();
        let rate_limits =
            RateLimits::build(&quota_plan(&config.catalog), SharedClock::system(), None);
        let quotas = Quotas::build(
            &quota_plan(&config.catalog),
            SharedClock::system(),
            &state::Backend::Memory,
            &QuotaMetrics::register(&Metrics::new()),
            None,
        );
        Fixture {
            arguments_budget: structure::ArgumentsBudget::new(
                config.limits.max_parsed_arguments_bytes_in_flight,
            ),
            config,
            rate_limits,
            quotas,
            budgets: toolgate::budgets::Budgets::on(
                &state::Backend::Memory,
                SharedClock::system(),
                &Metrics::new(),
            ),
            keys,
            arguments: serde_json::from_str(ARGUMENTS).expect("valid JSON"),
        }
    }

    fn limits(&self) -> &LimitsConfig {
        &self.config.limits
    }

    /// What a call of a catalog without budgets spends: nothing.
    fn no_budgets(&self) -> toolgate::limits::Spend<'_> {
        toolgate::limits::Spend {
            charges: &[],
            budgets: &self.budgets,
            max_entries: 0,
        }
    }
}

static SMALL: LazyLock<Fixture> = LazyLock::new(|| Fixture::build(SIZES[0]));
static MEDIUM: LazyLock<Fixture> = LazyLock::new(|| Fixture::build(SIZES[1]));
static LARGE: LazyLock<Fixture> = LazyLock::new(|| Fixture::build(SIZES[2]));

fn fixture(tools: usize) -> &'static Fixture {
    match tools {
        10 => &SMALL,
        1_000 => &MEDIUM,
        10_000 => &LARGE,
        other => panic!("no fixture for {other} tools"),
    }
}

/// A stage's answer for a call the fixture means to be allowed. A refusal fails the run loudly:
/// timing a short-circuited refusal instead of the stage's work would report a number for work
/// that was never done (a fixture drifting into a refusal, say after a catalog change).
fn allowed<T, E: std::fmt::Debug>(stage: &str, key: &str, answer: Result<T, E>) -> T {
    answer.unwrap_or_else(|refusal| panic!("{stage} refused {key}: {refusal:?}"))
}

/// The next key of the rotation.
fn next<'f>(fixture: &'f Fixture, i: &mut usize) -> &'f Key {
    *i = (*i + 1) & (KEYS - 1);
    &fixture.keys[*i]
}

/// Loading and validating the whole catalog (what start-up and every reload pay).
#[divan::bench(args = SIZES, sample_count = 3, sample_size = 1)]
fn load_catalog(bencher: Bencher, tools: usize) {
    let yaml = catalog_yaml(tools);
    bencher.bench_local(|| load(black_box(&yaml)));
}

/// Stages 1-2: name, size, depth, and parsing the arguments.
#[divan::bench]
fn structure_check(bencher: Bencher) {
    let limits = LimitsConfig::default();
    let budget = structure::ArgumentsBudget::new(limits.max_parsed_arguments_bytes_in_flight);
    bencher.bench_local(|| {
        allowed(
            "structure",
            "tool_00002",
            structure::check(
                black_box("tool_00002"),
                black_box(ARGUMENTS),
                &limits,
                &budget,
            ),
        )
    });
}

/// Stage 3: the tool's version for this tenant (canary buckets included).
#[divan::bench(args = SIZES)]
fn resolve(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher.bench_local(|| {
        let key = next(f, &mut i);
        allowed(
            "resolve",
            &key.name,
            f.config
                .catalog
                .resolve(black_box(&key.name), None, &key.caller.tenant),
        )
        .version
        .len()
    });
}

/// Stage 4: global, tenant and agent allow/deny lists.
#[divan::bench(args = SIZES)]
fn access_check(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher.bench_local(|| {
        let key = next(f, &mut i);
        allowed(
            "access",
            &key.name,
            access::check(
                &f.config.catalog,
                // Access reads only the name (the bench catalog has no conditions).
                &Input::listing(
                    &key.caller,
                    ToolFacts {
                        name: black_box(&key.name),
                        version: "",
                        risk_level: "",
                    },
                ),
            ),
        )
    });
}

/// Stage 5: required scopes.
#[divan::bench(args = SIZES)]
fn scopes_check(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher.bench_local(|| {
        let key = next(f, &mut i);
        allowed("scopes", &key.name, scopes::check(&key.caller, &key.tool))
    });
}

/// Stage 6: the arguments against the tool's visible JSON Schema.
#[divan::bench(args = SIZES)]
fn schema_check(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher.bench_local(|| {
        let key = next(f, &mut i);
        allowed(
            "schema",
            &key.name,
            schema::check(&key.tool, black_box(&f.arguments)),
        )
    });
}

/// Stage 7: writing the bound tenant filter (the arguments' copy is made outside the timing).
#[divan::bench(args = SIZES)]
fn bind_apply(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher
        .with_inputs(|| {
            i = (i + 1) & (KEYS - 1);
            (i, f.arguments.clone())
        })
        .bench_local_values(|(i, arguments)| {
            let key = &f.keys[i];
            allowed(
                "bind",
                &key.name,
                bind::apply(&key.tool, &key.caller, arguments),
            )
        });
}

/// Stage 8: the tool's per-tenant quota and the tenant's overall quota, through the enum the
/// boundary calls (`Quotas`, memory backend): its future completes on the first poll.
#[divan::bench(args = SIZES)]
fn rate_limit_check(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher.bench_local(|| {
        let key = next(f, &mut i);
        let answer = f
            .quotas
            .check(
                &key.caller.tenant,
                quota_of(&key.tool),
                key.tenant_rate,
                Cost::ONE,
                &f.no_budgets(),
            )
            .now_or_never()
            .expect("the memory limiter answers without waiting");
        allowed("rate limit", &key.name, answer)
    });
}

/// Stage 8 on the in-memory limiter directly: what the enum dispatch above adds is the
/// difference.
#[divan::bench(args = SIZES)]
fn rate_limit_check_direct(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher.bench_local(|| {
        let key = next(f, &mut i);
        allowed(
            "rate limit",
            &key.name,
            f.rate_limits
                .check(&key.caller.tenant, quota_of(&key.tool), key.tenant_rate),
        )
    });
}

/// Stages 1-8 as the chain runs them for an allowed call, plus the canonical SHA-256 of the bound
/// arguments it computes for audit and approvals: everything before approval and execution.
#[divan::bench(args = SIZES)]
fn decision_chain(bencher: Bencher, tools: usize) {
    let f = fixture(tools);
    let mut i = 0;
    bencher.bench_local(|| {
        let key = next(f, &mut i);
        let name = key.name.as_str();
        let (arguments, _held) = allowed(
            "structure",
            name,
            structure::check(name, black_box(ARGUMENTS), f.limits(), &f.arguments_budget),
        );
        let catalog = &f.config.catalog;
        let tool = allowed(
            "resolve",
            name,
            catalog.resolve(name, None, &key.caller.tenant),
        );
        allowed(
            "access",
            name,
            access::check(catalog, &Input::listing(&key.caller, tool.facts())),
        );
        allowed("scopes", name, scopes::check(&key.caller, tool));
        allowed("schema", name, schema::check(tool, &arguments));
        let mut bound = allowed("bind", name, bind::apply(tool, &key.caller, arguments));
        canonical::normalize(&mut bound);
        let sha = canonical::sha256_hex(&bound);
        let quota = f
            .quotas
            .check(
                &key.caller.tenant,
                quota_of(tool),
                key.tenant_rate,
                Cost::ONE,
                &f.no_budgets(),
            )
            .now_or_never()
            .expect("the memory limiter answers without waiting");
        allowed("rate limit", name, quota);
        sha
    });
}

const JWT_SECRET: &str = "toolgate-bench-hs256-secret-0123456789abcdef";

/// A resolver verifying HS256 JWTs (signature, exp, iss, aud), as the server does from the
/// `authorization` metadata.
fn jwt_resolver() -> IdentityResolver {
    jwt_resolver_caching(1 << 22)
}

/// The same with a verified-token cache of `cache_bytes`.
fn jwt_resolver_caching(cache_bytes: usize) -> IdentityResolver {
    let config = Config::from_yaml(
        "version: 1\nidentity:\n  jwt:\n    hs256_secret_env: BENCH_SECRET\n    issuer: [\"https://issuer.bench\"]\n    audience: [toolgate]\n",
        "bench",
        Path::new("."),
        &Env::default().with("BENCH_SECRET", JWT_SECRET),
    )
    .unwrap_or_else(|e| panic!("jwt catalog: {e}"));
    IdentityResolver::new(&config.identity, SharedClock::system(), cache_bytes, None).unwrap()
}

/// `authorization` metadata with a valid token; `run` makes each token distinct.
fn jwt_metadata(run: usize) -> MetadataMap {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        + 86_400;
    let claims = serde_json::json!({
        "sub": "alice", "tenant": "tenant-0001", "agent": "support-bot", "scope": "kb:read tickets:read",
        "iss": "https://issuer.bench", "aud": "toolgate", "exp": exp, "run": run,
    });
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()).expect("a secret"),
    )
    .expect("a token");
    let mut metadata = MetadataMap::new();
    metadata.insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    metadata
}

/// Who is calling, per request, when the token was seen before: an agent runtime sends the same
/// JWT with every call of a run, so this is the common case (a verified-token cache hit).
#[divan::bench]
fn identity_jwt_hs256(bencher: Bencher) {
    let resolver = jwt_resolver();
    let metadata = jwt_metadata(0);
    allowed("identity", "the token", resolver.resolve(metadata.as_ref()));
    bencher.bench_local(|| {
        allowed(
            "identity",
            "the token",
            resolver.resolve(black_box(metadata.as_ref())),
        )
    });
}

/// The same for a token never seen before: full signature and claims verification, plus the
/// cache's bookkeeping (8,192 distinct tokens used in turn, and a 64 KiB cache that holds about a
/// hundred: each is evicted long before it comes round again).
#[divan::bench]
fn identity_jwt_hs256_first_sight(bencher: Bencher) {
    let resolver = jwt_resolver_caching(64 * 1024);
    let tokens: Vec<MetadataMap> = (0..8192).map(jwt_metadata).collect();
    let mut next = 0;
    bencher.bench_local(|| {
        next = (next + 1) % tokens.len();
        allowed(
            "identity",
            "a fresh token",
            resolver.resolve(black_box(tokens[next].as_ref())),
        )
    });
}

/// The same with dev identity headers, for comparison.
#[divan::bench]
fn identity_dev_headers(bencher: Bencher) {
    let metadata = dev_metadata("tenant-0001");
    bencher.bench_local(|| {
        allowed(
            "identity",
            "dev headers",
            DEV_RESOLVER.resolve(black_box(metadata.as_ref())),
        )
    });
}

/// How many conditional entries the condition benchmarks give a tenant.
const RULES: &[usize] = &[1, 10, 100];

/// A catalog whose tenant `acme` denies `send_email` under `rules` conditions written by
/// `condition(i)`, none of which holds for the benchmarks' call, so every one is evaluated.
fn conditional_catalog(rules: usize, condition: impl Fn(usize) -> String) -> Config {
    let mut yaml = String::from(
        "version: 1\nidentity: { dev_identity: true }\ntenants:\n  acme:\n    deny:\n",
    );
    for i in 0..rules {
        yaml.push_str(&format!(
            "      - {{ tools: [send_email], when: \"{}\" }}\n",
            condition(i)
        ));
    }
    yaml.push_str(
        "tools:\n  - name: send_email\n    description: Sends.\n    risk_level: read_only\n    \
         executor: { builtin: echo_arguments }\n    input_schema: { type: object, properties: \
         { to: { type: string }, text: { type: string } } }\n",
    );
    load(&yaml)
}

/// Stage 4b: `rules` deny entries whose conditions read the arguments
/// (`args.to.endsWith(...)`), all evaluated (none holds). Divide by `rules` for one condition.
#[divan::bench(args = RULES)]
fn conditions_on_the_arguments(bencher: Bencher, rules: usize) {
    let config = conditional_catalog(rules, |i| format!("args.to.endsWith('@evil{i}.example')"));
    let acme = caller("acme");
    let args: Value = serde_json::from_str(r#"{"to":"bob@acme.com","text":"hello"}"#).unwrap();
    let tool = config.catalog.resolve("send_email", None, "acme").unwrap();
    bencher.bench_local(|| {
        let call = CallFacts {
            args: black_box(&args),
            now: std::time::SystemTime::UNIX_EPOCH,
            run_id: "run-1",
        };
        let input = Input::of_call(&acme, tool.facts(), call);
        allowed(
            "access",
            "send_email",
            access::check(&config.catalog, &input),
        )
    });
}

/// Stage 4b on the rule "no recipient twice", `args.to.all(a, args.to.exists_one(b, b == a))`:
/// quadratic in the recipients, which the caller chooses. Up to 250 it is decided (250 take
/// ~750,000 of the 1,000,000 steps an evaluation may); 3,000 are refused at the budget, so that
/// row is what the most expensive evaluation costs (the in-place evaluator up to the budget,
/// then the interpreter up to it again). The chain runs it on a thread of its own.
#[divan::bench(args = [10, 100, 250, 3_000])]
fn condition_quadratic_at_the_budget(bencher: Bencher, recipients: usize) {
    let config = conditional_catalog(1, |_| {
        "!args.to.all(a, args.to.exists_one(b, b == a))".to_owned()
    });
    let acme = caller("acme");
    let to: Vec<String> = (0..recipients)
        .map(|i| format!("r{i}@example.com"))
        .collect();
    let args = serde_json::json!({ "to": to });
    let tool = config.catalog.resolve("send_email", None, "acme").unwrap();
    bencher.bench_local(|| {
        let call = CallFacts {
            args: black_box(&args),
            now: std::time::SystemTime::UNIX_EPOCH,
            run_id: "run-1",
        };
        let input = Input::of_call(&acme, tool.facts(), call);
        let decided = access::check(&config.catalog, &input);
        assert_eq!(decided.is_ok(), recipients <= 250, "{decided:?}");
    });
}

/// Stage 4: `rules` deny entries whose conditions read only the caller
/// (`caller.agent == ...`), decided without the call (as ListTools does).
#[divan::bench(args = RULES)]
fn conditions_on_the_caller(bencher: Bencher, rules: usize) {
    let config = conditional_catalog(rules, |i| format!("caller.agent == 'bot-{i}'"));
    let acme = caller("acme");
    let tool = config.catalog.resolve("send_email", None, "acme").unwrap();
    bencher.bench_local(|| {
        let input = Input::listing(black_box(&acme), tool.facts());
        allowed(
            "access",
            "send_email",
            access::check(&config.catalog, &input),
        )
    });
}

/// A tool output of 64 KiB as the output guard sees it: JSON records of ordinary text, with
/// `secrets` of them carrying an AWS key (0: nothing to redact, the common case).
fn tool_output(secrets: usize) -> String {
    let mut out = String::from("[");
    let mut i = 0;
    while out.len() < 64 * 1024 - 200 {
        if i > 0 {
            out.push(',');
        }
        let note = if i < secrets {
            "rotate key AKIAIOSFODNN7EXAMPLE today".to_owned()
        } else {
            format!("order {i} shipped to warehouse 7, customer note: leave at the door")
        };
        out.push_str(&format!(
            r#"{{"id":{i},"status":"shipped","amount_cents":{},"note":"{note}"}}"#,
            1000 + i * 7
        ));
        i += 1;
    }
    out.push(']');
    out
}

/// Stage 12b: the default output guard (every secret detector) over 64 KiB of output, with
/// nothing, 1 or 10 matches to redact. Target (issue 32): under 100 µs.
#[divan::bench(args = [0, 1, 10])]
fn output_guard_64k(bencher: Bencher, secrets: usize) {
    let guard = toolgate::output_guard::Guard::compile(None, None).expect("the default guard");
    let output = tool_output(secrets);
    assert_eq!(
        guard.screen(&output).findings.len(),
        usize::from(secrets > 0)
    );
    bencher.bench_local(|| guard.screen(black_box(&output)).text.len());
}

/// The default output guard over a short output with nothing to redact (the load harness's
/// echo: 256 bytes of text in JSON), what most calls return: the fixed cost per output.
#[divan::bench]
fn output_guard_short(bencher: Bencher) {
    let guard = toolgate::output_guard::Guard::compile(None, None).expect("the default guard");
    let output = serde_json::json!({ "text": "x".repeat(256) }).to_string();
    assert!(guard.screen(&output).findings.is_empty());
    bencher.bench_local(|| guard.screen(black_box(&output)).text.len());
}

/// The same 64 KiB with every detector on, the personal-data ones too (opt-in: their patterns
/// have no literal to look for first, so they cost more).
#[divan::bench]
fn output_guard_64k_every_detector(bencher: Bencher) {
    use toolgate::settings::raw::{RawGuardAction, RawOutputGuard};
    let section = RawOutputGuard {
        detectors: ["email", "payment_card", "iban", "phone"]
            .into_iter()
            .map(|name| (name.to_owned(), RawGuardAction::Redact))
            .collect(),
        ..RawOutputGuard::default()
    };
    let guard = toolgate::output_guard::Guard::compile(Some((&section, "output_guard")), None)
        .expect("every detector");
    let output = tool_output(0);
    bencher.bench_local(|| guard.screen(black_box(&output)).text.len());
}
