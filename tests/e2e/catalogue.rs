//! Loading: every invalid fixture gives located messages (snapshotted); good routes survive bad ones.

use std::path::Path;

use fabric::catalogue::{self, RouteEntry};

use crate::support::{fixtures, repo};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Loads the base catalogue plus one case file; returns the diagnostics with portable paths.
fn check_case(case: &Path) -> (String, usize, usize) {
    let tmp = tempfile::tempdir().unwrap();
    let routes = tmp.path().join("routes");
    let packs = tmp.path().join("packs");
    copy_dir(&fixtures().join("invalid-base/routes"), &routes);
    copy_dir(&fixtures().join("invalid-base/packs"), &packs);
    let name = case.file_name().unwrap();
    let is_pack = name.to_str().unwrap().starts_with("pack-");
    std::fs::copy(case, if is_pack { packs.join(name) } else { routes.join(name) }).unwrap();
    let cat = catalogue::load(&routes, &packs);
    let text: Vec<String> = cat.diagnostics().iter().map(|d| d.to_string().replace(&format!("{}/", tmp.path().display()), "")).collect();
    (text.join("\n"), cat.error_count(), cat.diagnostics().len() - cat.error_count())
}

#[test]
fn every_invalid_fixture_is_reported_with_locations() {
    let mut cases: Vec<_> = std::fs::read_dir(fixtures().join("invalid")).unwrap().map(|e| e.unwrap().path()).collect();
    cases.sort();
    assert!(cases.len() >= 12);
    for case in cases {
        let stem = case.file_stem().unwrap().to_str().unwrap().to_owned();
        let (text, errors, warnings) = check_case(&case);
        if stem.starts_with("warn-") {
            assert_eq!(errors, 0, "{stem}: {text}");
            assert!(warnings > 0, "{stem}: expected warnings");
        } else {
            assert!(errors > 0, "{stem}: expected errors, got:\n{text}");
        }
        // Every message is located in a file of the case: `path:line:col: ...`.
        for line in text.lines() {
            let mut parts = line.splitn(4, ':');
            let (path, l, c) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
            assert!(path.ends_with(".yaml"), "{stem}: {line}");
            assert!(l.parse::<u32>().unwrap() >= 1 && c.parse::<u32>().unwrap() >= 1, "{stem}: {line}");
        }
        insta::assert_snapshot!(format!("invalid__{stem}"), text);
    }
}

#[test]
fn a_broken_route_does_not_stop_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let routes = tmp.path().join("routes");
    copy_dir(&repo().join("routes"), &routes);
    std::fs::copy(fixtures().join("invalid/unknown-role.yaml"), routes.join("zz-broken.yaml")).unwrap();
    std::fs::copy(fixtures().join("invalid/yaml-syntax.yaml"), routes.join("zz-syntax.yaml")).unwrap();
    let cat = catalogue::load(&routes, &repo().join("prompt-packs"));
    let ready: Vec<&str> = cat.routes().filter_map(|r| if let RouteEntry::Ready(r) = r { Some(r.id()) } else { None }).collect();
    assert_eq!(ready, ["refund-review", "support-agent", "support-triage", "ticket-router"]);
    match cat.get("unknown-role") {
        Some(RouteEntry::Broken(b)) => assert!(b.problems.iter().any(|d| d.message.contains("unknown llm_role `summarize`")), "{:?}", b.problems),
        other => panic!("unknown-role should be broken: {other:?}"),
    }
    assert_eq!(cat.error_count(), 2);
}

#[test]
fn shipped_catalogue_is_clean() {
    let cat = catalogue::load(&repo().join("routes"), &repo().join("prompt-packs"));
    assert!(cat.diagnostics().is_empty(), "{:#?}", cat.diagnostics());
    assert_eq!(cat.routes().count(), 4);
}

/// Every source module says what it is for (rust-analyzer's tidy rule).
/// Inputs the fuzzers once broke: each loads (or parses) to diagnostics, never a panic.
#[test]
fn fuzz_regressions_replay() {
    use fabric::catalogue::{SourceFile, load_from_texts};
    let pack = SourceFile { path: "packs/support.yaml".into(), text: "host: You help.\n".into() };
    let mut n = 0;
    for entry in std::fs::read_dir(fixtures().join("fuzz-regressions")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if name.starts_with("catalogue_load-") {
            let cat = load_from_texts(&[SourceFile { path: "routes/fuzz.yaml".into(), text }], std::slice::from_ref(&pack));
            assert!(cat.error_count() > 0, "{name}");
        } else if name.starts_with("decision_text-") {
            let _ = fabric::decision::parse_text_protocol(&text);
        } else if name.starts_with("structured_reply-") {
            let schema = serde_json::json!({"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}}});
            let _ = fabric::structured::decode_reply(&fabric::structured::FlatSchema::from_json(&schema).unwrap(), &text);
        }
        n += 1;
    }
    assert!(n >= 1);
}

/// Every "is not defined" names what is defined, so a typo is seen at once.
#[test]
fn an_unknown_name_lists_the_names_that_are_defined() {
    use fabric::catalogue::{SourceFile, load_from_texts};
    let text = [
        "profiles: {default: {}}",
        "capabilities: {faq_answer: {}, faq_search: {input_schema: {type: object}}}",
        "workflows:",
        "  w: {stages: [{id: a, llm_role: classify, capability: faq_topics}]}",
        "  lin: {stages: [{id: a, llm_role: synthesis}]}",
        "manifests:",
        "  m: {workflow: nope, synthesis: {capability: faq_memo}}",
        "routes:",
        "  r: {model_profile: default, prompt_pack: p, workflow: w}",
        "  agent: {model_profile: default, prompt_pack: p, decision_loop: {tools: [faq_lookup]}}",
    ]
    .join("\n");
    let cat = load_from_texts(&[SourceFile { path: "routes/faq.yaml".into(), text }], &[SourceFile { path: "packs/p.yaml".into(), text: "host: H\n".into() }]);
    let messages: Vec<String> = cat.diagnostics().iter().map(ToString::to_string).collect();
    for expected in [
        "routes/faq.yaml:4:56: capability `faq_topics` is not defined (capabilities: faq_answer, faq_search)",
        "routes/faq.yaml:7:17: workflow `nope` is not defined (workflows: w, lin)",
        "routes/faq.yaml:7:47: capability `faq_memo` is not defined (capabilities: faq_answer, faq_search)",
        "routes/faq.yaml:10:75: tool `faq_lookup` is not a defined capability (capabilities: faq_answer, faq_search)",
    ] {
        assert!(messages.iter().any(|m| m == expected), "{expected}\nnot in {messages:#?}");
    }
}
