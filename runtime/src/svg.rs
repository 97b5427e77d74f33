//! The route graph as a self-contained SVG 1.1 document (`fabric hydrate --format svg`,
//! `GET /v1/routes/{route_id}/graph.svg`).
//!
//! Layout by layers, no graph library: a node's layer is its longest path from the entry over
//! the graph without its back edges (found by a depth-first walk in edge order); the nodes of a
//! layer stand side by side in listing order, the end marker last. Forward edges are straight
//! lines, a back edge curves round the right side, and an edge whose reverse exists (a decision
//! loop's `decide` ⇄ tool) is drawn as two parallel lines. Everything from the catalogue (ids,
//! conditions, descriptions) is cleaned of characters XML cannot hold and escaped, so a catalogue
//! cannot put markup into the document; there are no scripts, links or external references.
//! Numbers are formatted from integers and one decimal, so the same route gives the same bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use petgraph::graph::NodeIndex;

use crate::defs::LlmRole;
use crate::hydrate::{NodeKind, Route, RoutePath, StageNode, picture_edges};
use crate::prompt::PromptSource;

const MARGIN: f64 = 20.0;
const FONT: f64 = 12.0;
/// The advance of one character of the 12 px monospace font (0.6 em), and of the 11 px one.
const CHAR_W: f64 = 7.2;
const LABEL_CHAR_W: f64 = 6.6;
const LINE_H: f64 = 16.0;
const PAD: f64 = 10.0;
const MIN_BOX_W: f64 = 150.0;
const H_GAP: f64 = 40.0;
const V_GAP: f64 = 46.0;
const LABEL_STEP: f64 = 16.0;
/// Longest text of a box line or an edge label before it is cut with `…` (the tooltip has all).
const MAX_CHARS: usize = 44;
const MAX_HEADER_CHARS: usize = 110;
const END_W: f64 = 64.0;
const END_H: f64 = 36.0;

/// Removes what an XML document cannot hold: control characters (line breaks and tabs become
/// spaces) and the non-characters U+FFFE/U+FFFF.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' => ' ',
            c if (c as u32) < 0x20 || c == '\u{7f}' || c == '\u{fffe}' || c == '\u{ffff}' => '\u{fffd}',
            c => c,
        })
        .collect()
}

/// Text as XML character data or an attribute value: cleaned, then the five special characters escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in clean(s).chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn cut(s: &str, max: usize) -> String {
    let s = clean(s);
    if s.chars().count() <= max { s } else { s.chars().take(max - 1).chain(['…']).collect() }
}

/// A coordinate: one decimal at most, `-0` never.
fn num(x: f64) -> String {
    let r = (x * 10.0).round() / 10.0;
    let r = if r == 0.0 { 0.0 } else { r };
    if r.fract() == 0.0 { format!("{}", r as i64) } else { format!("{r:.1}") }
}

/// What a node's prompt is made from: the pack key it uses, or why it has none.
pub fn prompt_ref(route: &Route, node: &StageNode) -> String {
    let pack = route.pack().name();
    match node.prompt().source {
        PromptSource::RoleTemplate => format!("{pack}/roles.{}", node.role().as_str()),
        PromptSource::Host => format!("{pack}/host"),
        PromptSource::SynthesisTemplate => format!("{pack}/synthesis"),
        PromptSource::AgentWrapper => format!("{pack}/agent"),
        PromptSource::BuiltinAgentWrapper => format!("built-in agent + {pack}/host"),
        PromptSource::BuiltinSynthesis => "built-in synthesis".into(),
        PromptSource::Empty => "empty: default system text".into(),
        PromptSource::NotApplicable => "none (no model call)".into(),
    }
}

fn kind_text(node: &StageNode) -> String {
    match node.kind() {
        NodeKind::Stage | NodeKind::QueryFormulation => "workflow stage".into(),
        NodeKind::ChildRun { route } => format!("child run → {route}"),
        NodeKind::AppendedSynthesis => "appended synthesis".into(),
        NodeKind::Decision => "decision node".into(),
        NodeKind::Tool => match node.capability().and_then(|c| c.def.invoke.as_ref()) {
            Some(inv) => format!("tool · HTTP {}", inv.method.as_str()),
            None if node.capability().is_some_and(|c| c.def.mcp.is_some()) => "tool · MCP".into(),
            None if node.capability().is_some_and(|c| c.def.a2a.is_some()) => "tool · A2A agent".into(),
            None => "tool · in-process".into(),
        },
        NodeKind::End => "end".into(),
    }
}

/// The lines of a node's box (the first is its id) and its tooltip.
fn node_lines(route: &Route, node: &StageNode) -> (Vec<String>, String) {
    let fourth = match (node.kind(), node.capability()) {
        (NodeKind::Decision, _) => format!("tools: {}", route.tools().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")),
        (_, Some(c)) => format!("capability: {}", c.name),
        (_, None) => "capability: none".into(),
    };
    let lines = vec![node.id().to_owned(), kind_text(node), format!("llm_role: {}", node.role_name()), format!("prompt: {}", prompt_ref(route, node)), fourth];
    let mut tip = lines.join("\n");
    if node.role() != LlmRole::None || node.kind() == &NodeKind::Decision {
        let _ = write!(tip, "\nprompt source: {}", node.prompt().source.as_str());
    }
    if let Some(c) = node.capability()
        && !c.def.description.is_empty()
    {
        let _ = write!(tip, "\n{}", c.def.description.trim());
    }
    (lines, tip)
}

#[derive(Debug, Clone, Copy)]
struct Box2 {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Box2 {
    fn cx(&self) -> f64 {
        self.x + self.w / 2.0
    }
    fn bottom(&self) -> f64 {
        self.y + self.h
    }
    fn right(&self) -> f64 {
        self.x + self.w
    }
}

/// One edge, by (source, target) indices, in the order the runtime tries them.
#[derive(Debug)]
struct E {
    from: usize,
    to: usize,
    label: String,
    back: bool,
}

/// The edges of every node by (order, target), and which of them close a cycle.
fn edges_and_layers(route: &Route) -> (Vec<E>, Vec<usize>) {
    let g = route.graph();
    let n = g.node_count();
    let mut out: Vec<Vec<(usize, String)>> = vec![Vec::new(); n];
    for idx in g.node_indices() {
        out[idx.index()] = picture_edges(route, idx).into_iter().map(|(_, t, l)| (t.index(), l)).collect();
    }
    // Depth-first from the entry (then any node not reached), edges in run order.
    let mut state = vec![0u8; n];
    let mut finish: Vec<usize> = Vec::with_capacity(n);
    let mut back: Vec<(usize, usize)> = Vec::new();
    let roots = std::iter::once(route.entry().index()).chain(0..n);
    for root in roots {
        if state[root] != 0 {
            continue;
        }
        state[root] = 1;
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(top) = stack.last_mut() {
            let (u, i) = *top;
            if let Some((t, _)) = out[u].get(i) {
                top.1 += 1;
                match state[*t] {
                    0 => {
                        state[*t] = 1;
                        stack.push((*t, 0));
                    }
                    1 => back.push((u, *t)),
                    _ => {}
                }
            } else {
                state[u] = 2;
                finish.push(u);
                stack.pop();
            }
        }
    }
    let mut layer = vec![0usize; n];
    for &u in finish.iter().rev() {
        for (t, _) in &out[u] {
            if !back.contains(&(u, *t)) {
                layer[*t] = layer[*t].max(layer[u] + 1);
            }
        }
    }
    // The end marker sits below everything.
    let ends: Vec<usize> = g.node_indices().filter(|i| g[*i].kind() == &NodeKind::End).map(NodeIndex::index).collect();
    let deepest = (0..n).filter(|i| !ends.contains(i)).map(|i| layer[i]).max().unwrap_or(0);
    for e in ends {
        layer[e] = layer[e].max(deepest + 1);
    }
    let edges = out
        .into_iter()
        .enumerate()
        .flat_map(|(from, v)| v.into_iter().map(move |(to, label)| (from, to, label)))
        .map(|(from, to, label)| E { from, to, back: layer[to] <= layer[from], label })
        .collect();
    (edges, layer)
}

struct Svg {
    body: String,
    max_x: f64,
}

impl Svg {
    fn text(&mut self, x: f64, y: f64, text: &str, attrs: &str) {
        let _ = writeln!(self.body, "<text x=\"{}\" y=\"{}\"{attrs}>{}</text>", num(x), num(y), escape(text));
    }

    fn label(&mut self, x: f64, y: f64, text: &str, anchor_middle: bool) {
        let w = text.chars().count() as f64 * LABEL_CHAR_W + 6.0;
        let left = if anchor_middle { x - w / 2.0 } else { x - 3.0 };
        self.max_x = self.max_x.max(left + w);
        let _ = writeln!(
            self.body,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"14\" rx=\"3\" fill=\"#ffffff\" fill-opacity=\"0.9\"/>",
            num(left),
            num(y - 10.5),
            num(w)
        );
        let anchor = if anchor_middle { " text-anchor=\"middle\"" } else { "" };
        self.text(x, y, text, &format!(" font-size=\"11\" fill=\"#7a3e00\"{anchor}"));
    }

    fn arrowhead(&mut self, tip: (f64, f64), from: (f64, f64)) {
        let (dx, dy) = (tip.0 - from.0, tip.1 - from.1);
        let len = (dx * dx + dy * dy).sqrt().max(1e-9);
        let (ux, uy) = (dx / len, dy / len);
        let base = (tip.0 - 9.0 * ux, tip.1 - 9.0 * uy);
        let (a, b) = ((base.0 - 4.5 * uy, base.1 + 4.5 * ux), (base.0 + 4.5 * uy, base.1 - 4.5 * ux));
        let _ = writeln!(self.body, "<polygon points=\"{},{} {},{} {},{}\" fill=\"#444444\"/>", num(tip.0), num(tip.1), num(a.0), num(a.1), num(b.0), num(b.1));
    }
}

/// The route's graph as an SVG 1.1 document (UTF-8, with its XML declaration).
pub fn render_svg(route: &Route) -> String {
    let g = route.graph();
    let n = g.node_count();
    let (edges, layer) = edges_and_layers(route);

    // Header lines.
    let mut header = vec![format!("route {} · {} path", route.id(), route.path().as_str())];
    if !route.description().is_empty() {
        header.push(route.description().to_owned());
    }
    header.push(format!(
        "{}model_profile {} · prompt_pack {} · fleet {}",
        route.source().map(|s| format!("{} {s} · ", if route.path() == RoutePath::Manifest { "manifest" } else { "workflow" })).unwrap_or_default(),
        route.model_profile(),
        route.pack().name(),
        route.activation_target().unwrap_or("any"),
    ));
    if route.path() == RoutePath::DecisionLoop {
        header
            .push(format!("decision loop: decide calls one tool per step and reads its result, until DONE or ASK (at most {} steps)", route.max_loop_steps()));
    }
    let header: Vec<String> = header.iter().map(|h| cut(h, MAX_HEADER_CHARS)).collect();
    let header_h = MARGIN + header.len() as f64 * 18.0 + 14.0;

    // Box sizes.
    let mut content: Vec<(Vec<String>, String)> = Vec::with_capacity(n);
    let mut size: Vec<(f64, f64)> = Vec::with_capacity(n);
    for idx in g.node_indices() {
        let node = &g[idx];
        if node.kind() == &NodeKind::End {
            content.push((vec!["end".into()], "end: the run completes".into()));
            size.push((END_W, END_H));
            continue;
        }
        let (lines, tip) = node_lines(route, node);
        let lines: Vec<String> = lines.iter().map(|l| cut(l, MAX_CHARS)).collect();
        let chars = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0) as f64;
        size.push(((chars * CHAR_W + 2.0 * PAD).max(MIN_BOX_W).ceil(), lines.len() as f64 * LINE_H + PAD + 6.0));
        content.push((lines, tip));
    }

    // Layers: rows of nodes, listing order within a row.
    let rows = layer.iter().copied().max().map_or(0, |m| m + 1);
    let mut row_nodes: Vec<Vec<usize>> = vec![Vec::new(); rows];
    for (i, l) in layer.iter().enumerate() {
        row_nodes[*l].push(i);
    }
    // Labels of forward edges are stacked below their source, one line each.
    let mut labelled_below = vec![0usize; n];
    for e in edges.iter().filter(|e| !e.back && !e.label.is_empty()) {
        labelled_below[e.from] += 1;
    }
    let row_w: Vec<f64> = row_nodes.iter().map(|r| r.iter().map(|i| size[*i].0).sum::<f64>() + H_GAP * r.len().saturating_sub(1) as f64).collect();
    let header_w = header.iter().map(|h| h.chars().count() as f64 * CHAR_W).fold(0.0, f64::max);
    let content_w = row_w.iter().copied().fold(0.0, f64::max).max(header_w);
    let mut boxes = vec![Box2 { x: 0.0, y: 0.0, w: 0.0, h: 0.0 }; n];
    let mut y = header_h;
    for (r, nodes) in row_nodes.iter().enumerate() {
        let h = nodes.iter().map(|i| size[*i].1).fold(0.0, f64::max);
        let mut x = MARGIN + (content_w - row_w[r]) / 2.0;
        for &i in nodes {
            let (w, bh) = size[i];
            boxes[i] = Box2 { x, y: y + (h - bh) / 2.0, w, h: bh };
            x += w + H_GAP;
        }
        let labels = nodes.iter().map(|i| labelled_below[*i]).max().unwrap_or(0);
        y += h + V_GAP + LABEL_STEP * labels as f64;
    }
    let bottom = y - V_GAP;

    let mut svg = Svg { body: String::new(), max_x: MARGIN + content_w };
    let _ = writeln!(svg.body, "<g fill=\"none\" stroke=\"#444444\" stroke-width=\"1.3\">");
    // Where a line between two rows meets each box: one slot per neighbour, by its x.
    let has = |a: usize, b: usize| edges.iter().any(|e| e.from == a && e.to == b);
    let paired = |e: &E| e.from != e.to && has(e.to, e.from);
    let mut below: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut above: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for e in &edges {
        let (upper, lower) = if !e.back {
            (e.from, e.to)
        } else if paired(e) {
            (e.to, e.from)
        } else {
            continue;
        };
        for (map, key, other) in [(&mut below, upper, lower), (&mut above, lower, upper)] {
            let v = map.entry(key).or_default();
            if !v.contains(&other) {
                v.push(other);
            }
        }
    }
    for v in below.values_mut().chain(above.values_mut()) {
        v.sort_by(|a, b| boxes[*a].cx().total_cmp(&boxes[*b].cx()).then(a.cmp(b)));
    }
    let slot = |map: &BTreeMap<usize, Vec<usize>>, node: usize, other: usize| {
        let v = &map[&node];
        let k = v.iter().position(|o| *o == other).unwrap_or(0) as f64;
        let b = boxes[node];
        b.x + b.w * (k + 1.0) / (v.len() as f64 + 1.0)
    };
    let mut label_no = vec![0usize; n];
    let mut lanes = 0usize;
    let mut labels: Vec<(f64, f64, String, bool)> = Vec::new();
    for e in &edges {
        if !e.back || paired(e) {
            let (upper, lower) = if e.back { (e.to, e.from) } else { (e.from, e.to) };
            let mut a = (slot(&below, upper, lower), boxes[upper].bottom());
            let mut b = (slot(&above, lower, upper), boxes[lower].y);
            if paired(e) {
                // Two parallel lines: down on the left, up on the right.
                let off = if e.back { 6.0 } else { -6.0 };
                a.0 += off;
                b.0 += off;
            }
            let (from, to) = if e.back { (b, a) } else { (a, b) };
            let _ = writeln!(svg.body, "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", num(from.0), num(from.1), num(to.0), num(to.1));
            svg.arrowhead(to, from);
            if !e.label.is_empty() && e.back {
                // Up a paired line: beside it, halfway.
                labels.push(((from.0 + to.0) / 2.0 + 8.0, (from.1 + to.1) / 2.0 + 4.0, cut(&e.label, MAX_CHARS), false));
            } else if !e.label.is_empty() {
                let ly = boxes[e.from].bottom() + 15.0 + LABEL_STEP * label_no[e.from] as f64;
                label_no[e.from] += 1;
                let t = if (to.1 - from.1).abs() < 1e-9 { 0.5 } else { (ly - from.1) / (to.1 - from.1) };
                labels.push((from.0 + (to.0 - from.0) * t, ly + 4.0, cut(&e.label, MAX_CHARS), true));
            }
        } else {
            // A back edge: out of the source's right side, round, into the target's right side.
            let (s, t) = (boxes[e.from], boxes[e.to]);
            let from = (s.right(), s.y + s.h / 2.0 + 8.0);
            let to = (t.right(), t.y + t.h / 2.0 - 8.0);
            let lane = from.0.max(to.0) + 40.0 + 18.0 * lanes as f64;
            lanes += 1;
            let _ = writeln!(
                svg.body,
                "<path d=\"M {} {} C {} {} {} {} {} {}\"/>",
                num(from.0),
                num(from.1),
                num(lane),
                num(from.1),
                num(lane),
                num(to.1),
                num(to.0),
                num(to.1)
            );
            svg.arrowhead(to, (lane, to.1));
            let peak = 0.75 * lane + 0.125 * (from.0 + to.0);
            svg.max_x = svg.max_x.max(peak);
            if !e.label.is_empty() {
                labels.push((peak + 6.0, (from.1 + to.1) / 2.0 + 4.0, cut(&e.label, MAX_CHARS), false));
            }
        }
    }
    let _ = writeln!(svg.body, "</g>");
    for (x, y, text, middle) in labels {
        svg.label(x, y, &text, middle);
    }

    // Nodes over the edges.
    for idx in g.node_indices() {
        let i = idx.index();
        let b = boxes[i];
        let (lines, tip) = &content[i];
        let tip: Vec<String> = tip.lines().map(escape).collect();
        let _ = writeln!(svg.body, "<g>\n<title>{}</title>", tip.join("\n"));
        let kind = g[idx].kind();
        if kind == &NodeKind::End {
            let (cx, cy) = (b.cx(), b.y + b.h / 2.0);
            let _ = writeln!(
                svg.body,
                "<ellipse cx=\"{0}\" cy=\"{1}\" rx=\"{2}\" ry=\"{3}\" fill=\"#ffffff\" stroke=\"#333333\" stroke-width=\"1.3\"/>\n<ellipse cx=\"{0}\" cy=\"{1}\" rx=\"{4}\" ry=\"{5}\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1.3\"/>",
                num(cx),
                num(cy),
                num(b.w / 2.0),
                num(b.h / 2.0),
                num(b.w / 2.0 - 4.0),
                num(b.h / 2.0 - 4.0)
            );
            svg.text(cx, cy + 4.0, "end", " text-anchor=\"middle\"");
        } else {
            let (fill, stroke, extra) = match kind {
                NodeKind::Stage | NodeKind::QueryFormulation => ("#eef4fb", "#3a6ea5", " stroke-width=\"1.3\""),
                NodeKind::ChildRun { .. } => ("#fff6e6", "#b7791f", " stroke-width=\"1.3\" stroke-dasharray=\"6 3\""),
                NodeKind::AppendedSynthesis => ("#eefaf0", "#2f855a", " stroke-width=\"1.3\""),
                NodeKind::Decision => ("#fbeef5", "#a83279", " stroke-width=\"2.5\""),
                NodeKind::Tool | NodeKind::End => ("#f4f4f4", "#555555", " stroke-width=\"1.3\""),
            };
            let _ = writeln!(
                svg.body,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"6\" fill=\"{fill}\" stroke=\"{stroke}\"{extra}/>",
                num(b.x),
                num(b.y),
                num(b.w),
                num(b.h)
            );
            for (k, line) in lines.iter().enumerate() {
                let attrs = match k {
                    0 => " font-weight=\"bold\"",
                    1 => " fill=\"#555555\" font-style=\"italic\"",
                    _ => "",
                };
                svg.text(b.x + PAD, b.y + PAD + 10.0 + LINE_H * k as f64, line, attrs);
            }
        }
        let _ = writeln!(svg.body, "</g>");
    }

    let width = (svg.max_x + MARGIN).ceil();
    let height = (bottom + MARGIN).ceil();
    let mut out = String::with_capacity(svg.body.len() + 1024);
    out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" font-family=\"monospace\" font-size=\"{2}\">",
        num(width),
        num(height),
        num(FONT)
    );
    let _ = writeln!(out, "<title>route {}</title>", escape(route.id()));
    if !route.description().is_empty() {
        let _ = writeln!(out, "<desc>{}</desc>", escape(route.description()));
    }
    let _ = writeln!(out, "<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>", num(width), num(height));
    let mut hy = MARGIN + 12.0;
    for (k, h) in header.iter().enumerate() {
        let attrs = if k == 0 { " font-size=\"14\" font-weight=\"bold\"" } else { " fill=\"#444444\"" };
        let _ = writeln!(out, "<text x=\"{}\" y=\"{}\"{attrs}>{}</text>", num(MARGIN), num(hy), escape(h));
        hy += 18.0;
    }
    out.push_str(&svg.body);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{RouteEntry, SourceFile, load_from_texts};

    fn route(yaml: &str, id: &str) -> std::sync::Arc<Route> {
        let files = [SourceFile { path: "t/c.yaml".into(), text: format!("profiles: {{p: {{}}}}\n{yaml}") }];
        let packs = [SourceFile { path: "t/pack.yaml".into(), text: "host: HOST\nroles: {classify: 'CLASSIFY'}\n".into() }];
        let cat = load_from_texts(&files, &packs);
        match cat.get(id) {
            Some(RouteEntry::Ready(r)) => r.clone(),
            other => panic!("{other:?}: {:?}", cat.diagnostics()),
        }
    }

    #[test]
    fn escaping_leaves_no_markup_and_no_control_characters() {
        assert_eq!(escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
        assert_eq!(escape("a\nb\u{1}c\u{ffff}"), "a b\u{fffd}c\u{fffd}");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!((num(1.0), num(-0.01), num(2.25), num(7.16)), ("1".into(), "0".into(), "2.3".into(), "7.2".into()));
    }

    #[test]
    fn a_loop_back_is_curved_and_a_child_run_is_shown() {
        let r = route(
            "capabilities:\n  c: {output_schema: {type: object, properties: {x: {type: string}}}}\nworkflows:\n  w:\n    stages:\n      - {id: a, llm_role: classify, capability: c}\n      - {id: b, kind: child_run, llm_role: none, route: other}\n      - {id: d, llm_role: classify, branches: [{when: {slot: a.x, exists: true}, goto: a}, {goto: end}]}\n  o: {stages: [{id: z, llm_role: classify}]}\nroutes:\n  r: {model_profile: p, prompt_pack: pack, workflow: w}\n  other: {model_profile: p, prompt_pack: pack, workflow: o}\n",
            "r",
        );
        let (edges, layer) = edges_and_layers(&r);
        assert_eq!(layer, [0, 1, 2, 3]);
        assert_eq!(edges.iter().filter(|e| e.back).map(|e| (e.from, e.to)).collect::<Vec<_>>(), [(2, 0)]);
        let svg = render_svg(&r);
        assert!(svg.contains("<path d=\"M "), "{svg}");
        assert!(svg.contains("child run → other"), "{svg}");
        assert!(svg.contains("a.x exists"), "{svg}");
        assert_eq!(svg, render_svg(&r), "deterministic");
    }
}
