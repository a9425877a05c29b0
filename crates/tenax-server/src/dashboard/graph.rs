//! A workflow drawn server-side as SVG: its tasks as boxes coloured by status, its
//! dependencies as arrows, left to right. A task's column is its depth (the longest
//! path from a task without parents), so every arrow points right; within a column the
//! tasks keep their id order. Each box links to its task. Everything is drawn with
//! presentation attributes, none with inline `style`, so the dashboard's strict
//! Content-Security-Policy blocks none of it.
use std::collections::HashMap;

use maud::{html, Markup};

/// Tasks above this are listed only: a graph that size is not read by eye.
pub(crate) const MAX_DRAWN: usize = 200;

const BOX_W: i64 = 150;
const BOX_H: i64 = 38;
const GAP_X: i64 = 60;
const GAP_Y: i64 = 14;
const MARGIN: i64 = 10;

/// One task to draw: its id (the link), key, status and its parents' keys.
pub(crate) struct Node<'a> {
    pub(crate) id: i64,
    pub(crate) key: &'a str,
    pub(crate) status: &'a str,
    pub(crate) parents: &'a [String],
}

/// The fill of a task's box, by status (the badges' colours).
fn fill(status: &str) -> &'static str {
    match status {
        "succeeded" => "#dcf2e3",
        "dead" => "#fbe0dd",
        "retrying" => "#fdf0d5",
        "running" => "#dbeafb",
        "cancelled" => "#ececec",
        "blocked" => "#f6f7f9",
        _ => "#ffffff",
    }
}

/// Each task's column: 0 without parents, else one past its deepest parent. A parent
/// that is not among `nodes` counts as a root; a cycle (which the storage refuses) is
/// cut where it is met.
fn columns(nodes: &[Node<'_>]) -> Vec<usize> {
    let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.key, i)).collect();
    let mut column: Vec<Option<usize>> = vec![None; nodes.len()];
    for start in 0..nodes.len() {
        // Depth-first, with an explicit stack: a deep chain must not overflow ours.
        let mut stack = vec![(start, false)];
        let mut open = vec![false; nodes.len()];
        while let Some((i, expanded)) = stack.pop() {
            if column[i].is_some() {
                continue;
            }
            let parents: Vec<usize> = nodes[i]
                .parents
                .iter()
                .filter_map(|p| index.get(p.as_str()).copied())
                .collect();
            if expanded {
                let depth = parents
                    .iter()
                    .filter_map(|p| column[*p].map(|c| c + 1))
                    .max()
                    .unwrap_or(0);
                column[i] = Some(depth);
                continue;
            }
            open[i] = true;
            stack.push((i, true));
            for p in parents {
                if column[p].is_none() && !open[p] {
                    stack.push((p, false));
                }
            }
        }
    }
    column.into_iter().map(Option::unwrap_or_default).collect()
}

/// The SVG of a workflow's tasks and dependencies.
pub(crate) fn draw(nodes: &[Node<'_>]) -> Markup {
    let column = columns(nodes);
    let mut row_of = vec![0_i64; nodes.len()];
    let mut rows: HashMap<usize, i64> = HashMap::new();
    for (i, c) in column.iter().enumerate() {
        let next = rows.entry(*c).or_default();
        row_of[i] = *next;
        *next += 1;
    }
    let width_cols = column.iter().max().map_or(1, |c| *c as i64 + 1);
    let height_rows = rows.values().max().copied().unwrap_or(1);
    let width = 2 * MARGIN + width_cols * BOX_W + (width_cols - 1) * GAP_X;
    let height = 2 * MARGIN + height_rows * BOX_H + (height_rows - 1) * GAP_Y;
    let at = |i: usize| {
        (
            MARGIN + column[i] as i64 * (BOX_W + GAP_X),
            MARGIN + row_of[i] * (BOX_H + GAP_Y),
        )
    };
    let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.key, i)).collect();
    let edges: Vec<(usize, usize)> = nodes
        .iter()
        .enumerate()
        .flat_map(|(child, n)| {
            n.parents
                .iter()
                .filter_map(|p| index.get(p.as_str()).map(|parent| (*parent, child)))
                .collect::<Vec<_>>()
        })
        .collect();
    html! {
        svg class="workflow-graph" xmlns="http://www.w3.org/2000/svg" role="img"
            width=(width) height=(height) viewBox={ "0 0 " (width) " " (height) } {
            title { "The workflow's tasks and their dependencies" }
            defs {
                marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"
                    markerHeight="7" orient="auto-start-reverse" {
                    path d="M 0 0 L 10 5 L 0 10 z" fill="#5b6670" {}
                }
            }
            @for (parent, child) in &edges {
                @let (px, py) = at(*parent);
                @let (cx, cy) = at(*child);
                path class="edge" d={ "M " (px + BOX_W) " " (py + BOX_H / 2)
                    " C " (px + BOX_W + GAP_X / 2) " " (py + BOX_H / 2) ", "
                    (cx - GAP_X / 2) " " (cy + BOX_H / 2) ", " (cx) " " (cy + BOX_H / 2) }
                    fill="none" stroke="#5b6670" stroke-width="1.2" marker-end="url(#arrow)" {}
            }
            @for (i, n) in nodes.iter().enumerate() {
                @let (x, y) = at(i);
                a href={ "#task/" (n.id) } {
                    g class={ "node status-" (n.status) } data-key=(n.key) {
                        rect x=(x) y=(y) width=(BOX_W) height=(BOX_H) rx="5"
                            fill=(fill(n.status)) stroke="#8a949e" {}
                        text x=(x + 8) y=(y + 16) font-size="13" fill="#1d232a" { (n.key) }
                        text x=(x + 8) y=(y + 31) font-size="11" fill="#5b6670" { (n.status) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node<'a>(id: i64, key: &'a str, status: &'a str, parents: &'a [String]) -> Node<'a> {
        Node {
            id,
            key,
            status,
            parents,
        }
    }

    #[test]
    fn a_task_stands_one_column_right_of_its_deepest_parent() {
        let none: Vec<String> = Vec::new();
        let after_a = vec!["a".to_owned()];
        let after_b = vec!["b".to_owned()];
        let after_a_c = vec!["a".to_owned(), "c".to_owned()];
        let nodes = [
            node(1, "a", "succeeded", &none),
            node(2, "b", "running", &after_a),
            node(3, "c", "blocked", &after_b),
            node(4, "d", "blocked", &after_a_c),
            node(5, "e", "pending", &none),
        ];
        assert_eq!(columns(&nodes), [0, 1, 2, 3, 0]);
    }

    #[test]
    fn the_drawing_has_a_box_per_task_in_its_colour_and_an_arrow_per_dependency() {
        let none: Vec<String> = Vec::new();
        let after_a = vec!["a".to_owned()];
        let nodes = [
            node(7, "a", "dead", &none),
            node(8, "b", "cancelled", &after_a),
            node(9, "c", "cancelled", &after_a),
        ];
        let svg = draw(&nodes).into_string();
        assert_eq!(svg.matches("<rect").count(), 3, "{svg}");
        assert_eq!(svg.matches("class=\"edge\"").count(), 2, "{svg}");
        assert!(svg.contains("href=\"#task/7\""), "{svg}");
        assert!(
            svg.contains("fill=\"#fbe0dd\""),
            "a dead task is red: {svg}"
        );
        assert_eq!(svg.matches("fill=\"#ececec\"").count(), 2, "{svg}");
        assert!(!svg.contains("style="), "no inline style: {svg}");
    }

    #[test]
    fn a_cycle_or_an_unknown_parent_does_not_hang_the_drawing() {
        let after_b = vec!["b".to_owned()];
        let after_a = vec!["a".to_owned()];
        let after_ghost = vec!["ghost".to_owned()];
        let nodes = [
            node(1, "a", "blocked", &after_b),
            node(2, "b", "blocked", &after_a),
            node(3, "c", "blocked", &after_ghost),
        ];
        let column = columns(&nodes);
        assert_eq!(column[2], 0, "an unknown parent counts as none");
        assert_eq!(draw(&nodes).into_string().matches("<rect").count(), 3);
    }
}
