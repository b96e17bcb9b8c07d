//! The compiler: loading a pipeline file into a checked [`Pipeline`]: parse with spans, apply the
//! profile and `--set` overrides, check the `[pipeline]` table and every stage
//! against its kind's option schema, build stages, check the graph (unknown inputs,
//! arity, cycles, unused outputs) and plan columns in topological order.

pub mod graph;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::BTreeMap;

use serde::Deserialize;
use synth_core::data::arrow::datatypes::SchemaRef;

pub use self::graph::Graph;
use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::diag::{Diagnostics, did_you_mean, stage_subject};
use synth_core::config::node::{self, Node, SourceFile, Span, Table, Value};
use synth_core::config::options::{CheckCtx, OptionSpans, OptionSpec, POSITIVE, RATIO, Ty, UINT, check_table};
use synth_engine::registry::Registry;
use synth_engine::stages::{
    Arity, BuildCtx, COMMON_OPTIONS, KindInfo, PartitionCtx, Partitioning, PlanCtx, PlanInput, Role, Sharding, Stage,
};
use synth_llm::provider::ProviderDesc;

/// Top-level tables of a pipeline file.
pub const TOP_LEVEL: &[&str] = &["pipeline", "stages", "providers", "embedders", "profiles", "regenerate"];

const PIPELINE_OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("name", Ty::Str, "pipeline name (default: the file name)"),
    OptionSpec::optional("description", Ty::Str, "free text").runtime_only(),
    OptionSpec::default("seed", UINT, "0", "seed every random choice derives from"),
    OptionSpec::default(
        "root",
        Ty::Str,
        "\".\"",
        "directory relative paths are resolved against, relative to this file",
    ),
    OptionSpec::optional("output_dir", Ty::Str, "where outputs go, relative to root (default: outputs/<name>)"),
    OptionSpec::default("max_failure_ratio", RATIO, "0.05", "default share of failed records that aborts a run"),
    OptionSpec::optional(
        "max_cost_usd",
        synth_core::config::options::NUMBER,
        "stop sending LLM requests (online or in batches) before this run's spending would pass this many USD",
    )
    .runtime_only(),
];

pub fn pipeline_options() -> &'static [OptionSpec] {
    PIPELINE_OPTIONS
}

/// `[regenerate.hub]`: where `synth regenerate --push` publishes snapshots.
const HUB_PUSH_OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("repo", Ty::Str, "repository snapshots are committed to, e.g. \"org/dataset\""),
    OptionSpec::default("branch", Ty::Str, "\"main\"", "branch the commit goes to"),
    OptionSpec::default("repo_type", Ty::Enum(&["dataset", "model"]), "\"dataset\"", "repository type"),
    OptionSpec::optional("endpoint", Ty::Str, "hub URL (default: HF_ENDPOINT, else https://huggingface.co)"),
    OptionSpec::default("token_env", Ty::Str, "\"HF_TOKEN\"", "environment variable holding a write token"),
    OptionSpec::default(
        "tag",
        Ty::Str,
        "\"{id}\"",
        "tag created on the commit ({id}, {date}, {fingerprint}, {name} are filled in; \"\" for none)",
    ),
];

/// Hook options: a command run through `sh -c` with the run's JSON summary on stdin.
pub const HOOKS: &[&str] = &["on_success", "on_failure", "on_unchanged"];

/// `[regenerate]`: snapshots, publishing and guards of `synth regenerate`.
const REGENERATE_OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("exports", Ty::List(&Ty::Str), "stages whose files make a snapshot (default: every sink)"),
    OptionSpec::optional(
        "card",
        Ty::Str,
        "export stage whose README.md gets the changelog (default: the export that writes README.md)",
    ),
    OptionSpec::default(
        "snapshots_dir",
        Ty::Str,
        "\"snapshots\"",
        "where snapshots go, relative to the output directory",
    ),
    OptionSpec::optional("keep", POSITIVE, "snapshots kept; older ones are removed after a new one (default: all)"),
    OptionSpec::optional("hub", Ty::Struct(HUB_PUSH_OPTIONS), "publish every snapshot to the Hugging Face Hub"),
    OptionSpec::optional("on_success", Ty::Str, "command run after a new snapshot (sh -c; JSON summary on stdin)"),
    OptionSpec::optional(
        "on_failure",
        Ty::Str,
        "command run after a failed regeneration (sh -c; JSON summary on stdin)",
    ),
    OptionSpec::optional("on_unchanged", Ty::Str, "command run when nothing changed (sh -c; JSON summary on stdin)"),
    OptionSpec::default("hook_timeout_seconds", POSITIVE, "300", "a hook still running after this is killed"),
];

pub fn regenerate_options() -> &'static [OptionSpec] {
    REGENERATE_OPTIONS
}

#[derive(Debug, Default, Clone)]
pub struct LoadOptions {
    pub profile: Option<String>,
    /// `KEY=VALUE` overrides, applied after the profile, in order.
    pub sets: Vec<String>,
    /// Stage kinds besides the built-in ones (embedders of the library, tests).
    pub extra_kinds: Vec<&'static KindInfo>,
}

/// A stage as configured and built.
pub struct StageDecl {
    pub name: String,
    pub kind: &'static KindInfo,
    pub inputs: Vec<String>,
    /// Checked options (defaults filled), including the common keys.
    pub options: serde_json::Value,
    pub spans: OptionSpans,
    pub span: Span,
    pub max_failure_ratio: f64,
    pub stage: Box<dyn Stage>,
    /// Columns known at plan time.
    pub planned_schema: Option<SchemaRef>,
    /// Local files the stage reads (from planning), hashed into its fingerprint.
    pub files: Vec<PathBuf>,
    /// How it can be split in a sharded run (its kind's answer, then its `shard` option).
    pub partitioning: Partitioning,
}

/// A checked pipeline: safe to run.
pub struct Pipeline {
    pub file: Arc<SourceFile>,
    /// BLAKE3 of the pipeline file's bytes.
    pub file_hash: String,
    pub root: PathBuf,
    pub name: String,
    pub seed: u64,
    pub output_dir: PathBuf,
    pub profile: Option<String>,
    pub stages: Vec<StageDecl>,
    pub graph: Graph,
    /// `[providers.NAME]` (chat) and `[embedders.NAME]` declarations.
    pub providers: BTreeMap<String, Decl>,
    pub embedders: BTreeMap<String, Decl>,
    /// The resolved document (profile and overrides applied, `profiles` removed).
    pub resolved: serde_json::Value,
    /// The kinds, parsers and offline shapes it was checked against.
    pub registry: Arc<Registry>,
    /// The checked `[regenerate]` table (defaults filled; an empty object when absent).
    pub regenerate: serde_json::Value,
    /// `[pipeline] max_cost_usd`: this run's spending cap.
    pub max_cost_usd: Option<f64>,
}

impl Pipeline {
    pub fn stage_index(&self, name: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.name == name)
    }
}

#[derive(Deserialize)]
struct PipelineTable {
    name: Option<String>,
    seed: u64,
    root: String,
    output_dir: Option<String>,
    max_failure_ratio: f64,
    #[serde(default)]
    max_cost_usd: Option<f64>,
}

/// Load and check a pipeline file against `registry` (plus `opts.extra_kinds`). Returns
/// the pipeline when there is no error, and every diagnostic (errors and warnings) found.
pub fn load(path: &Path, opts: &LoadOptions, registry: &Registry) -> (Option<Pipeline>, Diagnostics) {
    let mut diags = Diagnostics::default();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            let file = SourceFile::new(path, String::new());
            diags.error(&Span::file(&file, 0..0), None, format!("cannot read pipeline file: {e}"));
            return (None, diags);
        }
    };
    let file_hash = blake3::hash(&bytes).to_hex().to_string();
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).to_string();
            let file = SourceFile::new(path, text);
            diags.error(&Span::file(&file, valid..valid), None, "pipeline file is not valid UTF-8");
            return (None, diags);
        }
    };
    let file = SourceFile::new(path, text);
    let (doc, errors) = toml::de::DeTable::parse_recoverable(&file.text);
    for e in &errors {
        let range = e.span().unwrap_or(0..0);
        diags.error(&Span::file(&file, range), None, format!("TOML syntax: {}", e.message()));
    }
    if !errors.is_empty() {
        return (None, diags);
    }
    let mut root = node::from_de_table(&file, doc.get_ref());

    // Profiles: one file, several ways to run it.
    let profiles = root.remove("profiles");
    if let Some(profiles) = &profiles
        && profiles.node.as_table().is_none()
    {
        diags.error(&profiles.node.span, None, "\"profiles\" must be a table of [profiles.NAME] tables");
    }
    let registry = Arc::new(registry.with_kinds(&opts.extra_kinds));
    // `--profile a,b` applies a then b; a profile's `include = [...]` applies those first.
    for name in opts.profile.iter().flat_map(|p| p.split(',')).map(str::trim) {
        let mut chain = Vec::new();
        apply_profile(&mut root, profiles.as_ref(), &file, name, &registry, &mut chain, &mut diags);
    }
    for set in &opts.sets {
        apply_set(&mut root, set, &registry, &mut diags);
    }

    for dup in registry.duplicates() {
        let message = format!("{dup} is registered twice (a method or an extra kind reuses the name)");
        diags.error(&Span::file(&file, 0..0), None, message);
    }
    let pipeline = check(file.clone(), file_hash, root, opts.profile.clone(), registry, &mut diags);
    diags.sort();
    if diags.has_errors() { (None, diags) } else { (pipeline, diags) }
}

/// Apply `[profiles.NAME]` to the document: first the profiles it `include`s (in
/// order), then its own entries. `chain` holds the profiles being applied, to report
/// an include cycle instead of recursing forever.
fn apply_profile(
    root: &mut Table,
    profiles: Option<&node::Entry>,
    file: &Arc<SourceFile>,
    name: &str,
    registry: &Registry,
    chain: &mut Vec<String>,
    diags: &mut Diagnostics,
) {
    let table = profiles.and_then(|p| p.node.as_table());
    match table.and_then(|t| t.get(name)) {
        Some(entry) => match &entry.node.value {
            Value::Table(overlay) => {
                if chain.iter().any(|c| c == name) {
                    let cycle = chain.iter().map(String::as_str).chain([name]).collect::<Vec<_>>().join(" -> ");
                    diags.error(&entry.key_span, None, format!("profiles include each other: {cycle}"));
                    return;
                }
                if overlay.get("profiles").is_some() {
                    diags.error(&entry.node.span, None, format!("profile \"{name}\" cannot define profiles"));
                }
                let mut overlay = overlay.clone();
                if let Some(inc) = overlay.remove("include") {
                    let names: Option<Vec<&str>> = match &inc.node.value {
                        Value::Array(items) => items
                            .iter()
                            .map(|n| match &n.value {
                                Value::Str(s) => Some(s.as_str()),
                                _ => None,
                            })
                            .collect(),
                        Value::Str(s) => Some(vec![s.as_str()]),
                        _ => None,
                    };
                    match names {
                        Some(names) => {
                            chain.push(name.to_string());
                            for n in names {
                                apply_profile(root, profiles, file, n, registry, chain, diags);
                            }
                            chain.pop();
                        }
                        None => diags.error(
                            &inc.node.span,
                            None,
                            format!("profile \"{name}\": include must be a list of profile names"),
                        ),
                    }
                }
                resolve_redefined(root, &mut overlay, name, registry, diags);
                root.merge(overlay)
            }
            other => diags.error(
                &entry.node.span,
                None,
                format!("profile \"{name}\" must be a table, found {}", other.type_name()),
            ),
        },
        None => {
            let names: Vec<&str> = table.map(|t| t.keys().collect()).unwrap_or_default();
            let hint = did_you_mean(name, names.iter().copied()).unwrap_or_default();
            let span = profiles.map(|p| p.key_span.clone()).unwrap_or_else(|| Span::file(file, 0..0));
            diags.error(
                &span,
                None,
                format!(
                    "no profile \"{name}\"{hint} (profiles in this file: {})",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                ),
            );
        }
    }
}

/// How a profile's table for a stage, provider or embedder meets the base's table:
/// - it merges over it key by key (the base's `types`, `parallel`, ... stay unless the
///   profile sets them), also when it repeats the base's `kind`; an option that stands
///   in for others (a source's `path` for `hf` or `url`, a provider's `model_env` for
///   `model`: `OptionSpec::instead_of`) drops those from the base;
/// - `replace = true` in the profile's table replaces the base's table as a whole;
/// - a profile's table with another `kind` than the base's replaces it too (the base's
///   options belong to another kind), with a warning naming every option of the base
///   it drops and where it was defined, unless the table says `replace = true`.
fn resolve_redefined(
    root: &mut Table,
    overlay: &mut Table,
    profile: &str,
    registry: &Registry,
    diags: &mut Diagnostics,
) {
    for section in ["stages", "providers", "embedders"] {
        let what = match section {
            "stages" => "stage",
            "providers" => "provider",
            _ => "embedder",
        };
        let Some(Value::Table(over)) = overlay.get_mut(section).map(|e| &mut e.node.value) else { continue };
        let base = match root.get_mut(section).map(|e| &mut e.node.value) {
            Some(Value::Table(base)) => Some(base),
            _ => None,
        };
        let mut base = base;
        for e in over.entries.iter_mut() {
            let Value::Table(t) = &mut e.node.value else { continue };
            let replace = match t.remove("replace") {
                None => None,
                Some(r) => match r.node.value {
                    Value::Bool(b) => Some(b),
                    ref other => {
                        let message = format!(
                            "profile \"{profile}\": {what} \"{}\": replace must be true or false, found {}",
                            e.key,
                            other.type_name()
                        );
                        diags.error(&r.node.span, None, message);
                        None
                    }
                },
            };
            let Some(base) = base.as_deref_mut() else { continue };
            let Some(old) = base.get(&e.key) else { continue };
            let Value::Table(old_table) = &old.node.value else { continue };
            let kind_of = |t: &Table| match t.get("kind").map(|k| &k.node.value) {
                Some(Value::Str(k)) => Some(k.clone()),
                _ => None,
            };
            let (old_kind, new_kind) = (kind_of(old_table), kind_of(t));
            let other_kind = new_kind.is_some() && old_kind.is_some() && new_kind != old_kind;
            if replace == Some(true) || (other_kind && replace != Some(false)) {
                if other_kind && replace.is_none() {
                    let dropped: Vec<String> = old_table
                        .entries
                        .iter()
                        .filter(|o| o.key != "kind" && t.get(&o.key).is_none())
                        .map(|o| format!("{} ({})", o.key, o.key_span))
                        .collect();
                    if !dropped.is_empty() {
                        let message = format!(
                            "profile \"{profile}\" redefines {what} \"{}\" as kind \"{}\" (the base's is \"{}\", {}) and drops the base's {}: {}; write `replace = true` in the profile's table to say so, or set them there",
                            e.key,
                            new_kind.as_deref().unwrap_or_default(),
                            old_kind.as_deref().unwrap_or_default(),
                            old.key_span,
                            if dropped.len() == 1 { "option" } else { "options" },
                            dropped.join(", ")
                        );
                        diags.warning(&e.key_span, None, message);
                    }
                }
                base.remove(&e.key);
            } else if let Some(specs) = new_kind.or(old_kind).and_then(|k| option_specs(registry, section, &k)) {
                let gone: Vec<&str> = specs
                    .iter()
                    .filter(|o| t.get(o.name).is_some())
                    .flat_map(|o| o.instead_of.iter().copied())
                    .collect();
                if let Some(Value::Table(old_table)) = base.get_mut(&e.key).map(|o| &mut o.node.value) {
                    for key in gone {
                        old_table.remove(key);
                    }
                }
            }
        }
    }
}

/// The options of a stage, provider or embedder kind (`section` is the table it is under).
fn option_specs(registry: &Registry, section: &str, kind: &str) -> Option<&'static [OptionSpec]> {
    match section {
        "stages" => registry.kind(kind).map(|k| k.options),
        "providers" => registry.provider(kind).map(|k| k.kind.options),
        "embedders" => synth_embed::EMBEDDER_KINDS.iter().find(|k| k.name == kind).map(|k| k.options),
        _ => None,
    }
}

fn apply_set(root: &mut Table, set: &str, registry: &Registry, diags: &mut Diagnostics) {
    let arg: Arc<str> = Arc::from(set);
    let span = Span { origin: node::Origin::Arg(arg.clone()), start: 0, end: 0 };
    let Some((key, value)) = set.split_once('=') else {
        diags.error(&span, None, "expected KEY=VALUE (e.g. stages.sample.n=100)");
        return;
    };
    let path: Vec<String> = key.trim().split('.').map(|s| s.trim().trim_matches('"').to_string()).collect();
    if path.iter().any(String::is_empty) {
        diags.error(&span, None, format!("bad key \"{key}\""));
        return;
    }
    let node = node::parse_arg_value(&arg, value.trim());
    if let Err(e) = root.set_path(&path, node, &span) {
        diags.error(&span, None, format!("cannot set \"{key}\": {e}"));
        return;
    }
    // `--set stages.x.path=...` over a source reading `hf`: the path stands in for it.
    if let [section, stage, option] = path.as_slice()
        && let Some(Value::Table(stages)) = root.get_mut(section).map(|e| &mut e.node.value)
        && let Some(Value::Table(table)) = stages.get_mut(stage).map(|e| &mut e.node.value)
    {
        let specs = match table.get("kind").map(|k| &k.node.value) {
            Some(Value::Str(k)) => option_specs(registry, section, k),
            _ => None,
        };
        let spec = specs.and_then(|s| s.iter().find(|o| o.name == option.as_str()));
        for other in spec.map(|s| s.instead_of).unwrap_or_default() {
            table.remove(other);
        }
    }
}

pub use synth_core::config::normalize;

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !name.starts_with('-')
        && !name.starts_with('_')
}

fn check(
    file: Arc<SourceFile>,
    file_hash: String,
    root: Table,
    profile: Option<String>,
    registry: Arc<Registry>,
    diags: &mut Diagnostics,
) -> Option<Pipeline> {
    let file_span = Span::file(&file, 0..0);
    for entry in &root.entries {
        if !TOP_LEVEL.contains(&entry.key.as_str()) {
            let hint = did_you_mean(&entry.key, TOP_LEVEL.iter().copied()).unwrap_or_default();
            diags.error(&entry.key_span, None, format!("unknown top-level table \"{}\"{hint}", entry.key));
        }
    }
    let base_dir = file.path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base_dir = if base_dir.as_os_str().is_empty() { PathBuf::from(".") } else { base_dir };

    // [pipeline]
    let empty = Table::default();
    let (ptable, pspan) = match root.get("pipeline") {
        Some(e) => match e.node.as_table() {
            Some(t) => (t, e.node.span.clone()),
            None => {
                diags.error(&e.node.span, None, "\"pipeline\" must be a table");
                (&empty, file_span.clone())
            }
        },
        None => (&empty, file_span.clone()),
    };
    let mut pspans = OptionSpans { table: Some(pspan.clone()), ..Default::default() };
    let pctx = CheckCtx { root: &base_dir, subject: Some("[pipeline]"), extra_keys: &[] };
    let pjson = check_table(ptable, &pspan, PIPELINE_OPTIONS, &pctx, "", &mut pspans, diags);
    let ptable: Option<PipelineTable> = serde_json::from_value(serde_json::Value::Object(pjson)).ok();
    let root_dir = normalize(&ptable.as_ref().map(|p| base_dir.join(&p.root)).unwrap_or_else(|| base_dir.clone()));
    let name = ptable.as_ref().and_then(|p| p.name.clone()).unwrap_or_else(|| {
        file.path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "pipeline".into())
    });
    let default_ratio = ptable.as_ref().map(|p| p.max_failure_ratio).unwrap_or(0.05);

    let provider_kinds: Vec<&'static ProviderKind> = registry.providers.iter().map(|k| &k.kind).collect();
    let providers = check_decls(&root, "providers", "provider", &provider_kinds, &root_dir, diags);
    let embedders = check_decls(&root, "embedders", "embedder", synth_embed::EMBEDDER_KINDS, &root_dir, diags);

    // [stages.NAME]
    let mut raws: Vec<RawStage> = Vec::new();
    match root.get("stages") {
        None => diags.error(&file_span, None, "no [stages] table: a pipeline needs at least one stage"),
        Some(e) => match e.node.as_table() {
            None => diags.error(&e.node.span, None, "\"stages\" must be a table of [stages.NAME] tables"),
            Some(stages) => {
                let declared = declared_names(stages);
                for entry in &stages.entries {
                    if let Some(raw) = check_stage(
                        &entry.key,
                        &entry.key_span,
                        &entry.node,
                        &root_dir,
                        default_ratio,
                        &registry,
                        &declared,
                        diags,
                    ) {
                        raws.push(raw);
                    }
                }
            }
        },
    }

    let regenerate = check_regenerate(&root, &base_dir, &raws, diags);
    let (graph, broken) = check_graph(&raws, diags);
    let declared = Declared { providers: &providers, embedders: &embedders, provider_kinds: &registry.providers };
    plan(&mut raws, &graph, &broken, &root_dir, declared, diags);
    let runnable = !broken.iter().any(|b| *b);
    let decls: Option<Vec<StageDecl>> = raws.into_iter().map(|r| r.decl).collect();

    let mut resolved = Node { span: file_span, value: Value::Table(root) }.to_json();
    if let Some(obj) = resolved.as_object_mut() {
        obj.remove("profiles");
        // Hook commands often carry a webhook URL: never written to a manifest.
        if let Some(serde_json::Value::Object(regen)) = obj.get_mut("regenerate") {
            for hook in HOOKS {
                if let Some(v) = regen.get_mut(*hook) {
                    *v = serde_json::Value::String("***".into());
                }
            }
        }
    }
    let ptable = ptable?;
    let output_dir = normalize(&root_dir.join(ptable.output_dir.clone().unwrap_or_else(|| format!("outputs/{name}"))));
    Some(Pipeline {
        file,
        file_hash,
        root: root_dir,
        name,
        seed: ptable.seed,
        output_dir,
        profile,
        stages: decls?,
        graph: runnable.then_some(graph)?,
        providers,
        embedders,
        resolved,
        registry,
        regenerate,
        max_cost_usd: ptable.max_cost_usd,
    })
}

/// Check `[regenerate]`; its `exports` and `card` must name stages.
fn check_regenerate(root: &Table, base_dir: &Path, raws: &[RawStage], diags: &mut Diagnostics) -> serde_json::Value {
    let Some(entry) = root.get("regenerate") else {
        return serde_json::Value::Object(Default::default());
    };
    let Some(table) = entry.node.as_table() else {
        diags.error(&entry.node.span, None, "\"regenerate\" must be a table");
        return serde_json::Value::Object(Default::default());
    };
    let mut spans = OptionSpans { table: Some(entry.node.span.clone()), ..Default::default() };
    // The run's one cost cap is `[pipeline] max_cost_usd`; say so rather than "unknown option".
    let ctx = CheckCtx { root: base_dir, subject: Some("[regenerate]"), extra_keys: &["max_cost_usd"] };
    let checked = check_table(table, &entry.node.span, REGENERATE_OPTIONS, &ctx, "", &mut spans, diags);
    if let Some(cap) = table.get("max_cost_usd") {
        diags.error(
            &cap.key_span,
            Some("[regenerate]"),
            "max_cost_usd belongs in [pipeline] (the one cost cap of every run, regenerations included); `synth regenerate --max-cost-usd` overrides it",
        );
    }
    let names: Vec<&str> = raws.iter().map(|r| r.name.as_str()).collect();
    let mut check_stage = |name: &str, span: Span| {
        if !names.contains(&name) {
            let hint = did_you_mean(name, names.iter().copied()).unwrap_or_default();
            diags.error(&span, Some("[regenerate]"), format!("no stage \"{name}\"{hint}"));
        }
    };
    if let Some(exports) = checked.get("exports").and_then(|e| e.as_array()) {
        for e in exports.iter().filter_map(|e| e.as_str()) {
            check_stage(e, spans.get("exports"));
        }
    }
    if let Some(card) = checked.get("card").and_then(|c| c.as_str()) {
        check_stage(card, spans.get("card"));
    }
    serde_json::Value::Object(checked)
}

/// A stage table as far as it could be understood: always its name and inputs,
/// its kind when known, and the built stage when its options are valid.
struct RawStage {
    name: String,
    key_span: Span,
    kind: Option<&'static KindInfo>,
    inputs: Vec<String>,
    input_spans: Vec<Span>,
    inputs_span: Span,
    decl: Option<StageDecl>,
}

/// Names of a section's tables that the file (or a profile) declares, not a `--set`.
fn declared_names(section: &Table) -> Vec<&str> {
    section
        .entries
        .iter()
        .filter(|e| !matches!(e.key_span.origin, node::Origin::Arg(_)))
        .map(|e| e.key.as_str())
        .collect()
}

/// The error for a table without `kind`: when only a `--set` made it, the name is most
/// likely misspelt (`--set stages.sample.n=4` for `sampled`), so that is what it says.
fn missing_kind(what: &str, name: &str, key_span: &Span, declared: &[&str], kinds: &str) -> String {
    if matches!(key_span.origin, node::Origin::Arg(_)) {
        let hint = did_you_mean(name, declared.iter().copied()).unwrap_or_default();
        format!("no {what} \"{name}\" in the pipeline{hint}; a {what} that --set adds needs its \"kind\" ({kinds})")
    } else {
        format!("missing required option \"kind\" ({kinds})")
    }
}

#[allow(clippy::too_many_arguments)]
fn check_stage(
    name: &str,
    key_span: &Span,
    node: &Node,
    root: &Path,
    default_ratio: f64,
    registry: &Registry,
    declared: &[&str],
    diags: &mut Diagnostics,
) -> Option<RawStage> {
    let subject = stage_subject(name);
    if !valid_name(name) {
        diags.error(
            key_span,
            Some(&subject),
            "stage names use letters, digits, '_' and '-' (and start with a letter or digit)",
        );
    }
    let Some(table) = node.as_table() else {
        diags.error(&node.span, Some(&subject), format!("a stage must be a table, found {}", node.value.type_name()));
        return None;
    };
    // Inputs are read on their own so graph problems are found even when options are bad.
    let (inputs, input_spans, inputs_span) = match table.get("inputs") {
        Some(e) => match &e.node.value {
            Value::Array(items) => (
                items.iter().filter_map(|n| n.as_str().map(str::to_string)).collect(),
                items.iter().filter(|n| n.as_str().is_some()).map(|n| n.span.clone()).collect(),
                e.node.span.clone(),
            ),
            Value::Str(one) => (vec![one.clone()], vec![e.node.span.clone()], e.node.span.clone()),
            _ => (Vec::new(), Vec::new(), e.node.span.clone()),
        },
        None => (Vec::new(), Vec::new(), key_span.clone()),
    };
    let mut raw = RawStage {
        name: name.to_string(),
        key_span: key_span.clone(),
        kind: None,
        inputs,
        input_spans,
        inputs_span,
        decl: None,
    };
    let Some(kind_entry) = table.get("kind") else {
        diags.error(key_span, Some(&subject), missing_kind("stage", name, key_span, declared, "see `synth list`"));
        return Some(raw);
    };
    let Some(kind_name) = kind_entry.node.as_str() else {
        diags.error(&kind_entry.node.span, Some(&subject), "\"kind\" must be a string");
        return Some(raw);
    };
    let kinds = &registry.kinds;
    let Some(kind) = registry.kind(kind_name) else {
        // With a near name, the suggestion is enough (the whole list grows with every
        // method); without one, every kind is listed.
        let message = match did_you_mean(kind_name, kinds.iter().map(|k| k.name)) {
            Some(hint) => format!("unknown stage kind \"{kind_name}\"{hint}; `synth list` shows every kind"),
            None => {
                let kinds = kinds.iter().map(|k| k.name).collect::<Vec<_>>().join(", ");
                format!("unknown stage kind \"{kind_name}\" (kinds: {kinds})")
            }
        };
        diags.error(&kind_entry.node.span, Some(&subject), message);
        return Some(raw);
    };
    raw.kind = Some(kind);
    let specs: Vec<OptionSpec> = COMMON_OPTIONS.iter().chain(kind.options).copied().collect();
    let mut spans = OptionSpans { table: Some(key_span.clone()), ..Default::default() };
    let ctx = CheckCtx { root, subject: Some(&subject), extra_keys: &[] };
    let before = diags.n_errors();
    let options = serde_json::Value::Object(check_table(table, key_span, &specs, &ctx, "", &mut spans, diags));
    if diags.n_errors() > before {
        return Some(raw);
    }
    let max_failure_ratio = options.get("max_failure_ratio").and_then(|v| v.as_f64()).unwrap_or(default_ratio);
    let build_ctx = BuildCtx { name, options: &options, spans: &spans, root, parsers: &registry.parsers };
    let Some(stage) = (kind.build)(&build_ctx, diags) else { return Some(raw) };
    raw.decl = Some(StageDecl {
        name: name.to_string(),
        kind,
        inputs: raw.inputs.clone(),
        options,
        spans,
        span: key_span.clone(),
        max_failure_ratio,
        stage,
        planned_schema: None,
        files: Vec::new(),
        partitioning: Partitioning::Whole,
    });
    Some(raw)
}

/// Check inputs (they must name stages), arity and cycles; unused outputs are
/// warnings. Returns the graph and which stages are broken (the pipeline can run
/// only when none is).
fn check_graph(raws: &[RawStage], diags: &mut Diagnostics) -> (Graph, Vec<bool>) {
    let names: Vec<&str> = raws.iter().map(|r| r.name.as_str()).collect();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); raws.len()];
    let mut broken: Vec<bool> = raws.iter().map(|r| r.decl.is_none()).collect();
    for (i, r) in raws.iter().enumerate() {
        let subject = stage_subject(&r.name);
        for (input, span) in r.inputs.iter().zip(&r.input_spans) {
            match names.iter().position(|n| n == input) {
                Some(k) => {
                    if raws[k].kind.is_some_and(|kind| kind.role == Role::Sink) {
                        diags.error(
                            span,
                            Some(&subject),
                            format!("input \"{input}\" is a sink; sinks have no output to read"),
                        );
                        broken[i] = true;
                    }
                    if edges[i].contains(&k) {
                        diags.error(span, Some(&subject), format!("input \"{input}\" is listed twice"));
                        broken[i] = true;
                    } else {
                        edges[i].push(k);
                    }
                }
                None => {
                    let hint = did_you_mean(input, names.iter().copied()).unwrap_or_default();
                    diags.error(
                        span,
                        Some(&subject),
                        format!("unknown input \"{input}\"{hint}: no stage has that name"),
                    );
                    broken[i] = true;
                }
            }
        }
        let Some(kind) = r.kind else { continue };
        let n = r.inputs.len();
        let plural = |k: usize| if k == 1 { "" } else { "s" };
        let arity_msg = match kind.arity {
            Arity::None if n > 0 => Some(format!("a {} stage takes no inputs", kind.name)),
            Arity::Exactly(k) if n != k => {
                Some(format!("a {} stage takes exactly {k} input{}, found {n}", kind.name, plural(k)))
            }
            Arity::AtLeast(k) if n < k => {
                Some(format!("a {} stage takes at least {k} input{}, found {n}", kind.name, plural(k)))
            }
            _ => None,
        };
        if let Some(msg) = arity_msg {
            diags.error(&r.inputs_span, Some(&subject), msg);
            broken[i] = true;
        }
    }
    let graph = Graph::new(edges);
    for cycle in graph.cycles() {
        let chain: Vec<&str> = cycle.iter().chain(std::iter::once(&cycle[0])).map(|&i| names[i]).collect();
        let first = &raws[cycle[0]];
        diags.error(&first.inputs_span, Some(&stage_subject(&first.name)), format!("cycle: {}", chain.join(" -> ")));
        for &i in &cycle {
            broken[i] = true;
        }
    }
    for (i, r) in raws.iter().enumerate() {
        if r.kind.is_some_and(|k| k.role != Role::Sink) && graph.consumers[i].is_empty() {
            diags.warning(
                &r.key_span,
                Some(&stage_subject(&r.name)),
                "output is not used by any stage and the stage is not a sink (add a sink, or remove the stage)",
            );
        }
    }
    (graph, broken)
}

/// Plan columns in topological order, collecting stage-specific diagnostics. A
/// stage whose input could not be planned sees that input's columns as unknown.
/// What a stage's plan may look at besides its inputs: the declarations, and the provider kinds.
#[derive(Clone, Copy)]
struct Declared<'a> {
    providers: &'a BTreeMap<String, Decl>,
    embedders: &'a BTreeMap<String, Decl>,
    provider_kinds: &'a [&'static ProviderDesc],
}

fn plan(
    raws: &mut [RawStage],
    graph: &Graph,
    broken: &[bool],
    root: &Path,
    declared: Declared<'_>,
    diags: &mut Diagnostics,
) {
    let Declared { providers, embedders, provider_kinds } = declared;
    for &i in &graph.order {
        if raws[i].decl.is_none() || (broken[i] && raws[i].inputs.len() != graph.inputs[i].len()) {
            continue;
        }
        let inputs: Vec<PlanInput> = graph.inputs[i]
            .iter()
            .map(|&k| PlanInput {
                name: raws[k].name.clone(),
                schema: raws[k].decl.as_ref().and_then(|d| d.planned_schema.clone()),
                kind: raws[k].kind,
            })
            .collect();
        let d = raws[i].decl.as_ref().expect("checked");
        let mut ctx = PlanCtx {
            name: &d.name,
            spans: &d.spans,
            root,
            inputs,
            providers,
            embedders,
            provider_kinds,
            diags,
            files: Vec::new(),
        };
        let schema = d.stage.plan(&mut ctx);
        let files = std::mem::take(&mut ctx.files);
        let shard = d.options.get("shard").and_then(|v| v.as_bool());
        let own = d.stage.partitioning(&PartitionCtx { providers, embedders, shard });
        let partitioning = match (shard, own) {
            (Some(false), _) => Partitioning::Whole,
            (Some(true), Partitioning::Whole) => {
                let why = d.stage.why_whole().unwrap_or_else(|| "it needs its inputs whole".into());
                ctx.error("shard", format!("a \"{}\" stage cannot run as shards: {why} (remove `shard`)", d.kind.name));
                Partitioning::Whole
            }
            (Some(true), Partitioning::ByRecord(s)) => Partitioning::ByRecord(Sharding { heavy: true, ..s }),
            (Some(true), p @ (Partitioning::SplitInput { .. } | Partitioning::OwnParts)) => p,
            (None, p) => p,
        };
        let d = raws[i].decl.as_mut().expect("checked");
        d.planned_schema = schema;
        d.files = files;
        d.partitioning = partitioning;
    }
}

/// Check `[providers.NAME]` or `[embedders.NAME]` tables against their kinds.
fn check_decls(
    root: &Table,
    table: &str,
    what: &str,
    kinds: &[&'static ProviderKind],
    root_dir: &Path,
    diags: &mut Diagnostics,
) -> BTreeMap<String, Decl> {
    let mut out = BTreeMap::new();
    let Some(entry) = root.get(table) else { return out };
    let Some(t) = entry.node.as_table() else {
        diags.error(&entry.node.span, None, format!("\"{table}\" must be a table of [{table}.NAME] tables"));
        return out;
    };
    let declared = declared_names(t);
    for e in &t.entries {
        let subject = format!("{what} \"{}\"", e.key);
        if !valid_name(&e.key) {
            diags.error(&e.key_span, Some(&subject), "names use letters, digits, '_' and '-'");
        }
        let Some(body) = e.node.as_table() else {
            diags.error(&e.node.span, Some(&subject), format!("must be a table, found {}", e.node.value.type_name()));
            continue;
        };
        let Some(kind_name) = body.get("kind").and_then(|k| k.node.as_str()) else {
            let names = kinds.iter().map(|k| k.name).collect::<Vec<_>>().join(", ");
            diags.error(&e.key_span, Some(&subject), missing_kind(what, &e.key, &e.key_span, &declared, &names));
            continue;
        };
        let Some(kind) = kinds.iter().find(|k| k.name == kind_name) else {
            let span = body.get("kind").map(|k| k.node.span.clone()).unwrap_or_else(|| e.key_span.clone());
            let hint = did_you_mean(kind_name, kinds.iter().map(|k| k.name)).unwrap_or_default();
            diags.error(
                &span,
                Some(&subject),
                format!(
                    "unknown {what} kind \"{kind_name}\"{hint} (kinds: {})",
                    kinds.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
                ),
            );
            continue;
        };
        let mut spans = OptionSpans { table: Some(e.key_span.clone()), ..Default::default() };
        let ctx = CheckCtx { root: root_dir, subject: Some(&subject), extra_keys: &["kind"] };
        let before = diags.n_errors();
        let options = check_table(body, &e.key_span, kind.options, &ctx, "", &mut spans, diags);
        if diags.n_errors() == before
            && let Some(check) = kind.check
        {
            for (option, message) in check(&options, root_dir) {
                let span = spans.get(option);
                diags.error(&span, Some(&subject), message);
            }
        }
        if diags.n_errors() == before {
            out.insert(
                e.key.clone(),
                Decl { name: e.key.clone(), kind: kind.name.to_string(), options: serde_json::Value::Object(options) },
            );
        }
    }
    out
}
