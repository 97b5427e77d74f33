//! Hydration: the stamped prompt of every resolution path, as `fabric hydrate` shows it.

use fabric::catalogue::{self, RouteEntry};
use fabric::hydrate::{render_dot, render_mermaid, render_text};
use fabric::prompt::DEFAULT_SYSTEM_TEXT;
use fabric::svg::render_svg;

use crate::support::{fixtures, packs_dir, routes_dir};

fn load_fixture() -> catalogue::Catalogue {
    let dir = fixtures().join("hydrate");
    let cat = catalogue::load(&dir.join("routes"), &dir.join("packs"));
    assert_eq!(cat.error_count(), 0, "{:#?}", cat.diagnostics());
    cat
}

#[test]
fn every_resolution_path_is_stamped() {
    let cat = load_fixture();
    for entry in cat.routes() {
        let RouteEntry::Ready(route) = entry else { panic!("{entry:?}") };
        insta::assert_snapshot!(format!("hydrate__{}", route.id()), render_text(route));
    }
}

#[test]
fn empty_prompts_become_the_default_system_text() {
    let cat = load_fixture();
    let route = cat.route("manifest-no-role-template").unwrap();
    let first = &route.graph()[route.entry()];
    assert!(first.prompt().text.is_empty());
    assert_eq!(first.prompt().system_text(), DEFAULT_SYSTEM_TEXT);
}

#[test]
fn dot_and_mermaid_views() {
    let cat = catalogue::load(&routes_dir(), &packs_dir());
    let route = cat.route("ticket-router").unwrap();
    insta::assert_snapshot!("ticket_router_dot", render_dot(route));
    insta::assert_snapshot!("ticket_router_mermaid", render_mermaid(route));
}

/// A small XML well-formedness check of what `render_svg` may write: one `svg` root, balanced
/// tags, quoted attributes without duplicates, only the five entities, only the elements the
/// renderer uses, no event handler and no reference to anything outside the document.
pub(crate) fn check_svg(svg: &str) -> Result<(), String> {
    const ELEMENTS: [&str; 10] = ["svg", "title", "desc", "g", "rect", "text", "line", "polygon", "path", "ellipse"];
    fn entities(s: &str) -> Result<(), String> {
        if s.contains('<') {
            return Err(format!("`<` in text or value: {s:?}"));
        }
        for (i, _) in s.match_indices('&') {
            if !["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].iter().any(|e| s[i..].starts_with(e)) {
                return Err(format!("bad entity in {s:?}"));
            }
        }
        if s.chars().any(|c| (c as u32) < 0x20 && c != '\n' || c == '\u{fffe}' || c == '\u{ffff}') {
            return Err(format!("a character XML cannot hold in {s:?}"));
        }
        Ok(())
    }
    let rest = svg.strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n").ok_or("no XML declaration")?;
    let mut stack: Vec<&str> = Vec::new();
    let mut roots = 0;
    let mut rest = rest;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        if stack.is_empty() && !text.trim().is_empty() {
            return Err(format!("text outside the root: {text:?}"));
        }
        entities(text)?;
        let close = rest[open..].find('>').ok_or("unclosed tag")? + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            if stack.pop() != Some(name) {
                return Err(format!("`</{name}>` closes nothing open"));
            }
            continue;
        }
        let (tag, empty) = match tag.strip_suffix('/') {
            Some(t) => (t, true),
            None => (tag, false),
        };
        let name_end = tag.find(|c: char| c.is_whitespace()).unwrap_or(tag.len());
        let name = &tag[..name_end];
        if !ELEMENTS.contains(&name) {
            return Err(format!("element `{name}`"));
        }
        if stack.is_empty() {
            roots += 1;
            if name != "svg" {
                return Err(format!("root `{name}`"));
            }
        }
        let mut attrs = tag[name_end..].trim_start();
        let mut seen = Vec::new();
        while !attrs.is_empty() {
            let eq = attrs.find("=\"").ok_or_else(|| format!("attribute without a quoted value in <{tag}>"))?;
            let key = &attrs[..eq];
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':') {
                return Err(format!("attribute name {key:?}"));
            }
            if key.to_ascii_lowercase().starts_with("on") || key.contains("href") || key == "style" {
                return Err(format!("attribute `{key}`"));
            }
            if seen.contains(&key) {
                return Err(format!("duplicate attribute `{key}` in <{tag}>"));
            }
            seen.push(key);
            let value_end = attrs[eq + 2..].find('"').ok_or("unterminated attribute value")? + eq + 2;
            let value = &attrs[eq + 2..value_end];
            entities(value)?;
            if value.contains("url(") || value.contains("javascript:") {
                return Err(format!("a reference in `{key}`: {value:?}"));
            }
            attrs = attrs[value_end + 1..].trim_start();
        }
        if name == "svg" && !(seen.contains(&"xmlns") && seen.contains(&"viewBox") && seen.contains(&"width") && seen.contains(&"height")) {
            return Err("the root needs xmlns, viewBox, width and height".into());
        }
        if !empty {
            stack.push(name);
        }
    }
    if !stack.is_empty() || roots != 1 || rest.trim() != "" {
        return Err(format!("unbalanced document: open {stack:?}, {roots} roots"));
    }
    Ok(())
}

/// Whether ` on…=` (an event handler attribute) appears anywhere, inside text or not.
fn has_event_attribute(svg: &str) -> bool {
    svg.match_indices(" on").any(|(i, _)| {
        let rest = &svg[i + 3..];
        let name = rest.chars().take_while(char::is_ascii_alphabetic).count();
        name > 0 && rest[name..].trim_start().starts_with('=')
    })
}

#[test]
fn every_fixture_route_as_svg() {
    let cat = catalogue::load(&routes_dir(), &packs_dir());
    assert_eq!(cat.error_count(), 0, "{:#?}", cat.diagnostics());
    let mut count = 0;
    for entry in cat.routes() {
        let RouteEntry::Ready(route) = entry else { panic!("{entry:?}") };
        let svg = render_svg(route);
        check_svg(&svg).unwrap_or_else(|e| panic!("{}: {e}\n{svg}", route.id()));
        assert!(!svg.contains("<script") && !has_event_attribute(&svg), "{svg}");
        assert_eq!(svg, render_svg(route), "the same route gives the same bytes");
        insta::assert_snapshot!(format!("svg__{}", route.id()), svg);
        count += 1;
    }
    assert_eq!(count, 4);
}

#[test]
fn svg_of_every_resolution_path_is_well_formed() {
    let cat = load_fixture();
    for entry in cat.routes() {
        let RouteEntry::Ready(route) = entry else { panic!("{entry:?}") };
        let svg = render_svg(route);
        check_svg(&svg).unwrap_or_else(|e| panic!("{}: {e}\n{svg}", route.id()));
        for node in route.graph().node_weights().filter(|n| n.kind() != &fabric::hydrate::NodeKind::End) {
            assert!(svg.contains(&format!(">{}</text>", node.id())), "{}: node {} is drawn", route.id(), node.id());
        }
    }
}

#[test]
fn svg_escapes_hostile_catalogue_text() {
    // Stage and route ids are names (the loader refuses anything else); conditions, descriptions
    // and capability descriptions are free text and reach the picture.
    let hostile = r#"<script>alert(1)</script>" onload="alert(2)" & '"#;
    let yaml = format!(
        "capabilities:\n  evil_cap:\n    description: {hostile:?}\n    output_schema: {{type: object, properties: {{u: {{type: string}}}}}}\nworkflows:\n  w:\n    stages:\n      - id: a\n        llm_role: classify\n        capability: evil_cap\n        branches:\n          - when: {{slot: a.u, equals: {hostile:?}}}\n            goto: b\n          - when: {{slot: a.u, contains: {hostile:?}}}\n            goto: end\n      - {{id: b, llm_role: synthesis}}\nroutes:\n  evil:\n    description: {hostile:?}\n    model_profile: default\n    prompt_pack: support\n    workflow: w\n"
    );
    let cat = crate::support::catalogue_with(&[], &yaml);
    let route = cat.route("evil").unwrap();
    let svg = render_svg(route);
    check_svg(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    assert!(!svg.contains("<script") && !svg.contains("onload=\"") && !svg.contains("alert(1)</"), "{svg}");
    assert!(
        svg.contains("<desc>&lt;script&gt;alert(1)&lt;/script&gt;&quot; onload=&quot;alert(2)&quot; &amp; &#39;</desc>"),
        "the description, escaped: {svg}"
    );
    assert!(svg.contains("a.u == &quot;&lt;script&gt;alert(1)"), "the condition, escaped: {svg}");
    assert!(
        svg.contains("\n&lt;script&gt;alert(1)&lt;/script&gt;&quot; onload=&quot;alert(2)&quot; &amp; &#39;</title>"),
        "the capability's description, escaped: {svg}"
    );
}
