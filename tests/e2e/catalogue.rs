//! Loading: every invalid fixture gives located messages (snapshotted); good routes survive bad ones.

use std::path::Path;

use fabric::catalogue::{self, RouteEntry};

use crate::support::{copy_dir, fixtures, packs_dir, repo, routes_dir, stub_dir};

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
    copy_dir(&routes_dir(), &routes);
    std::fs::copy(fixtures().join("invalid/unknown-role.yaml"), routes.join("zz-broken.yaml")).unwrap();
    std::fs::copy(fixtures().join("invalid/yaml-syntax.yaml"), routes.join("zz-syntax.yaml")).unwrap();
    let cat = catalogue::load(&routes, &packs_dir());
    let ready: Vec<&str> = cat.routes().filter_map(|r| if let RouteEntry::Ready(r) = r { Some(r.id()) } else { None }).collect();
    assert_eq!(ready, ["refund-review", "support-agent", "support-triage", "ticket-router"]);
    match cat.get("unknown-role") {
        Some(RouteEntry::Broken(b)) => assert!(b.problems.iter().any(|d| d.message.contains("unknown llm_role `summarize`")), "{:?}", b.problems),
        other => panic!("unknown-role should be broken: {other:?}"),
    }
    assert_eq!(cat.error_count(), 2);
}

/// The YAML files of a directory, by name.
fn yaml_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

/// The fixture catalogue is a copy of the shipped examples: every file in it is byte for byte
/// the shipped file of the same name. The tests' snapshots and expected outputs (the README's
/// answer, the routes list, the pictures) were taken of the shipped routes and are now taken of
/// the copy, so a change to a shipped route, pack or script must be copied here too (and the
/// snapshots reviewed). The other direction is not checked: `routes/` may hold more files than
/// the copy, since that is where users add their routes.
#[test]
fn the_fixture_catalogue_is_the_shipped_one() {
    for (fixture, shipped) in [(routes_dir(), "routes"), (packs_dir(), "prompt-packs"), (stub_dir(), "stub")] {
        let names = yaml_files(&fixture);
        assert!(!names.is_empty(), "{}", fixture.display());
        for name in names {
            let copy = std::fs::read_to_string(fixture.join(&name)).unwrap();
            let original = std::fs::read_to_string(repo().join(shipped).join(&name))
                .unwrap_or_else(|e| panic!("{shipped}/{name}: {e} (tests/fixtures/catalogue copies the shipped examples only)"));
            assert!(copy == original, "tests/fixtures/catalogue/{shipped}/{name} differs from {shipped}/{name}: copy the shipped file over it");
        }
    }
}

/// Each shipped example route (the ones the fixture copies) loads from `routes/` without a
/// problem in its own files. What else `routes/` holds is the user's: a route added there does
/// not fail this test, and a broken one is reported by `fabric routes check`, not here.
#[test]
fn every_shipped_route_loads_without_problems() {
    let cat = catalogue::load(&repo().join("routes"), &repo().join("prompt-packs"));
    let shipped_files: Vec<String> = yaml_files(&routes_dir()).iter().map(|n| format!("routes/{n}")).collect();
    let ours: Vec<_> = cat.diagnostics().iter().filter(|d| shipped_files.iter().any(|f| d.path.ends_with(f))).collect();
    assert!(ours.is_empty(), "{ours:#?}");
    let fixture = crate::support::fixture_catalogue();
    assert!(fixture.diagnostics().is_empty(), "{:#?}", fixture.diagnostics());
    assert!(fixture.routes().count() >= 1);
    for entry in fixture.routes() {
        let RouteEntry::Ready(route) = entry else { unreachable!("no diagnostics, no broken route") };
        let id = route.id();
        match cat.get(id) {
            Some(RouteEntry::Ready(_)) => {}
            other => panic!("shipped route `{id}` is not ready in routes/: {other:?}"),
        }
    }
}

/// The tests never read `routes/` or `prompt-packs/`, where a user's own routes and packs go,
/// except the test above, which loads the shipped examples there by name: a layer spec that
/// starts with them (`routes:…`), a path joined onto the repository, a runtime built on them. A
/// user's route there defining a capability named like a test's once failed three tests.
#[test]
fn no_test_reads_the_users_routes() {
    // Spelled in pieces, so that this test's own lines do not match.
    let patterns = [
        concat!("repo().join(\"rou", "tes"),
        concat!("repo().join(\"prompt", "-packs"),
        concat!("\"rou", "tes:{"),
        concat!("\"rou", "tes:r"),
        concat!("\"rou", "tes:n"),
        concat!("\"prompt", "-packs:{"),
        concat!("\"prompt", "-packs:p"),
    ];
    let allowed = ["let cat = catalogue::load(&repo().join(\"routes\"), &repo().join(\"prompt-packs\"));"];
    let mut found = Vec::new();
    for dir in ["tests/e2e", "tests/e2e/hostile", "tests/e2e/sim", "bench/src", "python/src"] {
        let Ok(entries) = std::fs::read_dir(repo().join(dir)) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                if patterns.iter().any(|p| line.contains(p)) && !allowed.contains(&line.trim()) {
                    found.push(format!("{}:{}: {}", path.strip_prefix(repo()).unwrap().display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "tests that read the user's routes/ (use support::routes_dir() and packs_dir(), the fixture copy):\n{}", found.join("\n"));
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
