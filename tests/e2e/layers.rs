//! Layered catalogues and prompt packs (`--catalogue a:b`, `--prompt-packs a:b`): a team's
//! routes in their own directory beside the shipped profiles, and names defined in two layers
//! refused with both places.

use std::path::Path;

use fabric::catalogue::{self, Layers, RouteEntry};
use serde_json::Value;

use crate::support::{fabric_cli, repo};

/// The shipped profiles and packs the team's layer goes on: the fixture copy, relative to the
/// repository (where `fabric_cli` runs), never `routes/`, where a user's own routes go (a
/// capability of theirs named like the team's would fail these tests).
const SHIPPED_ROUTES: &str = "tests/fixtures/catalogue/routes";
const SHIPPED_PACKS: &str = "tests/fixtures/catalogue/prompt-packs";

/// A team's directory: one route on the shipped `default` profile with its own capability,
/// workflow and prompt pack, and its stub script.
struct Team {
    dir: tempfile::TempDir,
}

impl Team {
    fn new() -> Team {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["routes", "packs", "stub"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let team = Team { dir };
        team.write(
            "routes/faq.yaml",
            "capabilities:\n  faq_answer:\n    output_schema: {type: object, properties: {text: {type: string}}, required: [text]}\n\
             workflows:\n  team-faq:\n    stages:\n      - {id: answer, llm_role: synthesis, capability: faq_answer}\n\
             routes:\n  team-faq:\n    model_profile: default\n    prompt_pack: team\n    workflow: team-faq\n",
        );
        team.write("packs/team.yaml", "host: You answer from the team's FAQ.\n");
        team.write("stub/team-faq.yaml", "stages:\n  answer:\n    - '{\"text\": \"See the FAQ.\"}'\n");
        team
    }

    fn path(&self, sub: &str) -> String {
        self.dir.path().join(sub).to_str().unwrap().to_owned()
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.dir.path().join(file), text).unwrap();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The line and column of `needle` in a shipped file, 1-based, as diagnostics give them.
fn at(file: &Path, needle: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let (line, col) = text.lines().enumerate().find_map(|(i, l)| l.find(needle).map(|c| (i + 1, c + 1))).unwrap();
    format!("{}:{line}:{col}", file.strip_prefix(repo()).unwrap().display())
}

#[tokio::test]
async fn a_team_route_runs_beside_the_shipped_profiles() {
    let team = Team::new();
    let catalogue = format!("{SHIPPED_ROUTES}:{}", team.path("routes"));
    let packs = format!("{SHIPPED_PACKS}:{}", team.path("packs"));
    let stub = ("FABRIC_LLM_STUB", "1".to_owned());
    let args = ["--catalogue", &catalogue, "--prompt-packs", &packs, "--stub-dir", &team.path("stub")];
    let run = |extra: &'static [&'static str]| {
        let mut a = args.to_vec();
        a.extend_from_slice(extra);
        a
    };
    let o = fabric_cli(&run(&["run", "team-faq", "--goal", r#"{"question":"Where is the VPN guide?"}"#]), std::slice::from_ref(&stub)).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let result: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((result["status"].as_str(), result["output"].as_str()), (Some("completed"), Some("See the FAQ.")), "{result}");
    // The shipped routes are still there, and the whole catalogue is clean.
    let o = fabric_cli(&run(&["routes", "check"]), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", text(&o.stdout), text(&o.stderr));
    let o = fabric_cli(&run(&["routes", "list"]), &[]).await;
    let list = text(&o.stdout);
    assert!(list.lines().any(|l| l.starts_with("team-faq\t") && l.ends_with("\tok")), "{list}");
    assert!(list.lines().any(|l| l.starts_with("support-triage\t") && l.ends_with("\tok")), "{list}");
    // The same through the variables.
    let env =
        [stub.clone(), ("FABRIC_CATALOGUE_DIR", catalogue.clone()), ("FABRIC_PROMPT_PACKS_DIR", packs.clone()), ("FABRIC_LLM_STUB_DIR", team.path("stub"))];
    let o = fabric_cli(&["run", "team-faq", "--goal", "{}"], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // `doctor` shows each directory in the order it is read.
    let o = fabric_cli(&["doctor"], &env).await;
    let doctor = text(&o.stdout);
    let dirs = format!(
        "catalogue directories:\n  {SHIPPED_ROUTES}\n  {}\nprompt packs directories:\n  {SHIPPED_PACKS}\n  {}\n",
        team.path("routes"),
        team.path("packs")
    );
    assert!(doctor.contains(&dirs), "{doctor}");
    // Alone, the team's directory has no profile: what layering is for.
    let o = fabric_cli(&["--catalogue", &team.path("routes"), "--prompt-packs", &packs, "run", "team-faq", "--goal", "{}"], &[stub]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("model_profile `default` is not defined (profiles: none defined)"), "{}", text(&o.stderr));
}

#[tokio::test]
async fn a_name_defined_in_two_layers_is_refused_with_both_places() {
    let team = Team::new();
    team.write(
        "routes/dup.yaml",
        "routes:\n  support-triage:\n    model_profile: default\n    prompt_pack: team\n    workflow: team-faq\n\
         profiles:\n  default: {description: copied from the shipped profiles}\n",
    );
    let catalogue = format!("{SHIPPED_ROUTES}:{}", team.path("routes"));
    let packs = format!("{SHIPPED_PACKS}:{}", team.path("packs"));
    let o = fabric_cli(&["--catalogue", &catalogue, "--prompt-packs", &packs, "routes", "check"], &[]).await;
    assert_eq!(o.status.code(), Some(2));
    let check = text(&o.stdout);
    let dup = format!("{}/dup.yaml", team.path("routes"));
    // The second definition is located, and names the first.
    let route_line =
        format!("{dup}:2:3: route `support-triage` is already defined at {}; a name may be defined once (neither definition is used)", route_place());
    assert!(check.contains(&route_line), "{check}");
    let profile_line = format!(
        "{dup}:7:3: model profile `default` is already defined at {}; a name may be defined once (neither definition is used)",
        at(&repo().join(SHIPPED_ROUTES).join("profiles.yaml"), "default:")
    );
    assert!(check.contains(&profile_line), "{check}");
    // Neither definition runs; the run says where both are.
    let o =
        fabric_cli(&["--catalogue", &catalogue, "--prompt-packs", &packs, "run", "support-triage", "--goal", "{}"], &[("FABRIC_LLM_STUB", "1".into())]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains(&format!("is already defined at {}", route_place())), "{}", text(&o.stderr));
}

/// Where the shipped catalogue defines the route `support-triage` (under `routes:`).
fn route_place() -> String {
    let file = repo().join(SHIPPED_ROUTES).join("support-triage.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let section = text.lines().position(|l| l == "routes:").unwrap();
    let line = section + text.lines().skip(section).position(|l| l == "  support-triage:").unwrap() + 1;
    format!("{SHIPPED_ROUTES}/support-triage.yaml:{line}:3")
}

#[tokio::test]
async fn prompt_packs_are_layered_the_same_way() {
    let team = Team::new();
    // A pack of the team's with the name of a shipped one: neither is used.
    team.write("packs/support.yaml", "host: The team's support desk.\n");
    let packs = format!("{SHIPPED_PACKS}:{}", team.path("packs"));
    let o = fabric_cli(&["--prompt-packs", &packs, "routes", "check"], &[]).await;
    assert_eq!(o.status.code(), Some(2));
    let check = text(&o.stdout);
    let line = format!(
        "{}/support.yaml:1:1: prompt pack `support` is already defined at {SHIPPED_PACKS}/support.yaml:1:1; a pack name may be used once (neither pack is used)",
        team.path("packs")
    );
    assert!(check.contains(&line), "{check}");
    assert!(check.contains("prompt pack `support` has errors"), "the routes on it are broken: {check}");
    // The library reads the same layers.
    let cat = catalogue::load_layers(
        &Layers::parse(&format!("{}:{}", crate::support::routes_dir().display(), team.path("routes"))).unwrap(),
        &Layers::new(vec![crate::support::packs_dir(), team.path("packs").into()]).unwrap(),
    );
    assert!(matches!(cat.get("team-faq"), Some(RouteEntry::Ready(_))));
    assert!(matches!(cat.get("support-triage"), Some(RouteEntry::Broken(_))));
}

#[tokio::test]
async fn a_directory_given_twice_is_read_once_and_an_empty_entry_is_refused() {
    let twice = format!("{SHIPPED_ROUTES}:{SHIPPED_ROUTES}:./{SHIPPED_ROUTES}");
    let o = fabric_cli(&["--catalogue", &twice, "--prompt-packs", &format!("{SHIPPED_PACKS}:{SHIPPED_PACKS}"), "routes", "check"], &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", text(&o.stdout), text(&o.stderr));
    let stray = format!("{SHIPPED_ROUTES}:");
    let o = fabric_cli(&["--catalogue", &stray, "routes", "check"], &[]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains(&format!("`{stray}`: directory 2 of 2 is empty (a stray `:`?)")), "{}", text(&o.stderr));
}

#[tokio::test]
async fn the_service_serves_a_layered_catalogue() {
    use crate::service::{Server, get, post};
    let team = Team::new();
    let db = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", db.path().join("fabric.db").display());
    let (catalogue, packs) = (format!("{SHIPPED_ROUTES}:{}", team.path("routes")), format!("{SHIPPED_PACKS}:{}", team.path("packs")));
    let server = Server::start(&store, &team.dir.path().join("stub"), &[("FABRIC_CATALOGUE_DIR", &catalogue), ("FABRIC_PROMPT_PACKS_DIR", &packs)]);
    let routes = get(&server, "/v1/routes").await;
    let ids: Vec<&str> = routes.as_array().unwrap().iter().filter_map(|r| r["id"].as_str()).collect();
    assert!(ids.contains(&"team-faq") && ids.contains(&"support-triage"), "{routes}");
    let (status, run) = post(&server, "/v1/runs?wait=true", serde_json::json!({"route_id": "team-faq", "goal": {}, "model_profile": "default"})).await;
    assert_eq!((status, run["status"].as_str(), run["output"].as_str()), (200, Some("completed"), Some("See the FAQ.")), "{run}");
}
