//! The diff of two catalogues loaded from texts: each kind of change at its route and stage,
//! in the text view and as JSON; the line excerpt.

use super::text::{Line, changed_lines};
use super::*;
use crate::catalogue::{SourceFile, load_from_texts};

const PACK: &str =
    "host: HOST\nroles:\n  classify: |\n    Classify the ticket.\n    Reply with the category only.\nsynthesis: SYNTH\nagent: 'AGENT {{tools}}'\n";

const CATALOGUE: &str = "\
profiles: {p: {}, q: {}}
capabilities:
  c: {output_schema: {type: object, properties: {u: {type: string}}}}
  t: {input_schema: {type: object}, invoke: {url: 'http://tools.example/t?key=s3cret', timeout_ms: 1000}}
workflows:
  w:
    stages:
      - {id: a, llm_role: classify, capability: c, branches: [{when: {slot: a.u, equals: x}, goto: b}, {goto: end}]}
      - {id: b, llm_role: synthesis}
routes:
  staged: {model_profile: p, prompt_pack: pack, workflow: w}
  agent: {model_profile: p, prompt_pack: pack, decision_loop: {tools: [t]}}
";

fn load(catalogue: &str, pack: &str) -> Catalogue {
    load_from_texts(&[SourceFile { path: "r/c.yaml".into(), text: catalogue.into() }], &[SourceFile { path: "p/pack.yaml".into(), text: pack.into() }])
}

/// The diff from the base catalogue to one with `edits` (pairs of text replaced) applied.
fn diff_after(edits: &[(&str, &str)], pack_edits: &[(&str, &str)]) -> CatalogueDiff {
    let apply = |text: &str, edits: &[(&str, &str)]| {
        edits.iter().fold(text.to_owned(), |t, (from, to)| {
            assert!(t.contains(from), "`{from}` is not in the text");
            t.replace(from, to)
        })
    };
    diff(&load(CATALOGUE, PACK), &load(&apply(CATALOGUE, edits), &apply(PACK, pack_edits)))
}

/// The changes of one stage of one route.
fn fields<'a>(d: &'a CatalogueDiff, route: &str, stage: &str) -> &'a [FieldChange] {
    let Some(RouteDiff { change: RouteChange::Changed { stages, .. }, .. }) = d.routes.iter().find(|r| r.route == route) else {
        panic!("{route} unchanged: {d:?}")
    };
    match stages.iter().find(|s| s.stage == stage) {
        Some(StageDiff { change: StageChange::Changed { fields }, .. }) => fields,
        other => panic!("{stage}: {other:?}"),
    }
}

#[test]
fn a_catalogue_does_not_differ_from_itself() {
    let d = diff(&load(CATALOGUE, PACK), &load(CATALOGUE, PACK));
    assert!(d.is_empty(), "{d:?}");
    assert_eq!(d.to_string(), "");
    assert_eq!(serde_json::to_value(&d).unwrap(), serde_json::json!({"routes": []}));
}

#[test]
fn a_prompt_pack_edit_shows_at_the_stage_whose_prompt_it_changes() {
    let d = diff_after(&[], &[("Reply with the category only.", "Reply with the category and the urgency.")]);
    assert_eq!(d.routes.len(), 1, "only the staged route resolves the classify template: {d}");
    let [FieldChange::SystemPrompt { old: Some(old), new: Some(new) }] = fields(&d, "staged", "a") else { panic!("{d:?}") };
    assert!(old.contains("category only") && new.contains("and the urgency"));
    assert_eq!(
        d.to_string(),
        "route staged: stage a: system prompt changed\n  - Reply with the category only.\n  + Reply with the category and the urgency.\n"
    );
}

#[test]
fn role_edges_schema_and_settings_are_reported_where_they_change() {
    let d = diff_after(
        &[
            ("id: b, llm_role: synthesis", "id: b, llm_role: classify"),
            ("equals: x", "equals: y"),
            ("u: {type: string}", "u: {type: integer}"),
            ("staged: {model_profile: p", "staged: {model_profile: q"),
        ],
        &[],
    );
    let text = d.to_string();
    assert!(text.contains("route staged: model_profile: p -> q\n"), "{text}");
    assert!(text.contains("route staged: stage b: llm_role: synthesis -> classify\n"), "{text}");
    assert!(text.contains("route staged: stage a: edges changed\n  - -> b when a.u == \"x\"\n  + -> b when a.u == \"y\"\n"), "{text}");
    assert!(text.contains("route staged: stage a: output schema changed\n  - ") && text.contains("\"type\": \"integer\""), "{text}");
    // A synthesis streams by default, a classify stage does not: the role takes the switch along.
    assert!(matches!(
        fields(&d, "staged", "b"),
        [FieldChange::Role { .. }, FieldChange::Stream { old: true, new: false }, FieldChange::PromptSource { .. }, FieldChange::SystemPrompt { .. }]
    ));
    let json = serde_json::to_value(&d).unwrap();
    let staged = &json["routes"][0];
    assert_eq!(staged["route"], "staged");
    assert_eq!(staged["change"], "changed");
    assert_eq!(staged["settings"][0], serde_json::json!({"setting": "model_profile", "old": "p", "new": "q"}));
    let role = &staged["stages"].as_array().unwrap().iter().find(|s| s["stage"] == "b").unwrap()["fields"][0];
    assert_eq!(*role, serde_json::json!({"field": "role", "old": "synthesis", "new": "classify"}));
}

#[test]
fn a_tool_shows_its_call_without_secrets_and_its_input_schema() {
    let d = diff_after(
        &[("key=s3cret', timeout_ms: 1000", "key=other', timeout_ms: 2000"), ("input_schema: {type: object}", "input_schema: {type: object, required: [q]}")],
        &[],
    );
    let text = d.to_string();
    assert!(!text.contains("s3cret") && !serde_json::to_string(&d).unwrap().contains("s3cret"), "{text}");
    assert!(text.contains("route agent: stage t: tool call: GET http://tools.example/t?key=REDACTED (timeout 1000 ms) -> GET http://tools.example/t?key=REDACTED (timeout 2000 ms)\n"), "{text}");
    assert!(text.contains("route agent: stage t: input schema changed\n"), "{text}");
    // The decision node shows its tools to the model: their schemas are in its prompt.
    assert!(text.contains("route agent: stage decide: system prompt changed\n"), "{text}");
    // A change inside the part `redact` hides is still a change.
    let hidden = diff_after(&[("key=s3cret", "key=s3cret2")], &[]);
    assert!(hidden.to_string().contains("(in a part of the URL not shown)"), "{hidden}");
}

#[test]
fn routes_and_stages_added_removed_and_broken_are_named() {
    let d = diff_after(
        &[
            ("      - {id: b, llm_role: synthesis}\n", "      - {id: b2, llm_role: synthesis}\n"),
            ("goto: b}", "goto: b2}"),
            ("  agent: {model_profile: p,", "  agent: {model_profile: nope,"),
            ("routes:\n", "routes:\n  extra: {model_profile: p, prompt_pack: pack, workflow: w}\n"),
        ],
        &[],
    );
    let text = d.to_string();
    assert!(text.contains("route staged: stage b: removed (was stage, llm_role synthesis)\n"), "{text}");
    assert!(text.contains("route staged: stage b2: added (stage, llm_role synthesis)\n"), "{text}");
    assert!(text.contains("route extra: added\n"), "{text}");
    assert!(text.contains("route agent: became broken: 1 problem, the first: r/c.yaml:"), "{text}");
    assert!(text.contains("model_profile `nope` is not defined"), "{text}");
    let back = diff(&load(&CATALOGUE.replace("  agent: {model_profile: p,", "  agent: {model_profile: nope,"), PACK), &load(CATALOGUE, PACK));
    assert_eq!(back.routes, [RouteDiff { route: "agent".into(), change: RouteChange::BecameReady }]);
    let gone =
        diff(&load(CATALOGUE, PACK), &load(&CATALOGUE.replace("  agent: {model_profile: p, prompt_pack: pack, decision_loop: {tools: [t]}}\n", ""), PACK));
    assert_eq!(gone.to_string(), "route agent: removed\n");
    assert_eq!(serde_json::to_value(&gone).unwrap(), serde_json::json!({"routes": [{"route": "agent", "change": "removed", "broken": null}]}));
}

#[test]
fn an_excerpt_shows_only_the_lines_that_differ() {
    assert_eq!(changed_lines("a\nb\nc\nd\ne", "a\nB\nc\nd\nE"), [Line::Old("b"), Line::New("B"), Line::Gap, Line::Old("e"), Line::New("E")]);
    assert_eq!(changed_lines("a\nb", "a\nb\nc"), [Line::New("c")]);
    assert_eq!(changed_lines("x\ny", "y\nz"), [Line::Old("x"), Line::Gap, Line::New("z")]);
    assert!(changed_lines("same\n", "same").is_empty());
    // Past the matching bound the middle is shown whole, old then new.
    let (old, new) = ((0..600).map(|i| format!("o{i}\n")).collect::<String>(), (0..600).map(|i| format!("n{i}\n")).collect::<String>());
    let lines = changed_lines(&old, &new);
    assert_eq!((lines.len(), &lines[0], &lines[600]), (1200, &Line::Old("o0"), &Line::New("n0")));
}
