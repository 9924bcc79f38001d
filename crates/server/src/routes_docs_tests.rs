//! docs/server.md keeps in step with the router: its route table names every route of
//! [`ROUTES`] and no route the server lacks.

use super::ROUTES;

/// docs/server.md's route table (the rows of "## Routes") lists every route of [`ROUTES`]
/// under its method, as `` `METHOD /path` `` or as an alias of a row of that method
/// (`` (also `/path`) ``), and names no route the server lacks.
#[test]
fn the_route_table_in_docs_matches_routes() {
    let doc = include_str!("../../../docs/server.md");
    let section = doc
        .split_once("\n## Routes\n")
        .and_then(|(_, rest)| rest.split_once("\n#"))
        .expect("docs/server.md has a Routes section")
        .0;
    let rows: Vec<(&str, &str)> = section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|row| {
            let first = row.split(" |").next()?;
            let method = first.split(' ').next()?;
            ["GET", "POST", "DELETE"]
                .contains(&method)
                .then_some((method, first))
        })
        .collect();
    assert!(rows.len() > 10, "no route rows found: {rows:?}");
    // A path in a cell ends at a backtick, a space or a query string.
    let names = |cell: &str, path: &str| {
        cell.match_indices(path).any(|(at, _)| {
            let before = cell[..at].chars().last();
            let after = cell[at + path.len()..].chars().next();
            matches!(before, Some('`' | ' ')) && matches!(after, Some('`' | ' ' | '?'))
        })
    };
    let mut missing = Vec::new();
    for r in ROUTES {
        if !rows
            .iter()
            .any(|(method, cell)| *method == r.method.as_str() && names(cell, r.path))
        {
            missing.push(format!("{} {}", r.method, r.path));
        }
    }
    assert!(
        missing.is_empty(),
        "routes missing from docs/server.md's route table: {missing:?}"
    );
    for (method, cell) in &rows {
        let path = cell
            .trim_start_matches(method)
            .trim_start()
            .split(['`', '?'])
            .next()
            .unwrap_or_default();
        assert!(
            ROUTES
                .iter()
                .any(|r| r.method.as_str() == *method && r.path == path),
            "docs/server.md's route table lists {method} {path}, which ROUTES lacks"
        );
    }
}
