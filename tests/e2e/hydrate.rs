//! Hydration: the stamped prompt of every resolution path, as `fabric hydrate` shows it.

use fabric::catalogue::{self, RouteEntry};
use fabric::hydrate::{render_dot, render_mermaid, render_text};
use fabric::prompt::DEFAULT_SYSTEM_TEXT;

use crate::support::{fixtures, repo};

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
    let cat = catalogue::load(&repo().join("routes"), &repo().join("prompt-packs"));
    let route = cat.route("ticket-router").unwrap();
    insta::assert_snapshot!("ticket_router_dot", render_dot(route));
    insta::assert_snapshot!("ticket_router_mermaid", render_mermaid(route));
}
