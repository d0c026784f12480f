//! How values are written for a person: durations in the units the options take, and names
//! quoted short enough for a one-line message.

use std::time::Duration;

/// `250ms`, `1.5s`, `2m 5s`: a duration as a person writes it (and as the options take it).
pub fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) && d.subsec_millis() != 0 {
        let decimal = format!("{}.{:03}", d.as_secs(), d.subsec_millis());
        format!("{}s", decimal.trim_end_matches('0'))
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// How much of a resource name a message quotes, in characters: any name a person types fits,
/// and a generated 2,000-byte one still leaves the message on a line or two.
pub const NAME_SHOWN: usize = 64;

/// A name quoted for a message, cut to `max` characters: a 2,000-byte resource name is not
/// echoed whole (`"aaaa…" (2000 bytes)`). A set shows as its members: `"{a, b}"`.
pub fn shorten(name: &str, max: usize) -> String {
    let shown = redlock_mux::Resource::new(name.as_bytes()).to_string();
    let name = shown.as_str();
    let mut chars = name.chars();
    let head: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        format!("{head:?}… ({} bytes)", name.len())
    } else {
        format!("{head:?}")
    }
}

/// A lock's owner as read from a node, for the terminal: its bytes as text, control characters
/// (a foreign value's escape sequences) shown as `?`.
pub fn owner_text(owner: &[u8]) -> String {
    String::from_utf8_lossy(owner)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Rows of cells as aligned columns, each cell after two spaces, each line's trailing spaces
/// cut. The first row (the heading) sets how many columns there are: a shorter row (an
/// unreachable node and its reason) takes the first columns and does not widen them.
pub fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.first().map_or(0, Vec::len);
    let mut widths = vec![0usize; n];
    for r in rows.iter().filter(|r| r.len() == n) {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (cell, w) in r.iter().zip(&widths) {
            line.push_str("  ");
            line.push_str(cell);
            line.extend(std::iter::repeat_n(
                ' ',
                w.saturating_sub(cell.chars().count()),
            ));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
