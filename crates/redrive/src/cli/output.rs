//! Plain-text tables for the terminal (and, from `redrive_client::cli`, JSON printing).
//!
//! Widths count characters, not bytes (`0s – 1s` has a multi-byte dash), and the
//! last column is never padded, so lines carry no trailing blanks.

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table built row by row, rendered with two blanks between columns.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

/// Columns are separated by this.
const GAP: &str = "  ";

impl Table {
    /// A table with these column headers and alignments.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Self {
            headers: columns.iter().map(|(h, _)| (*h).to_owned()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row; missing cells are blank, extra cells are dropped.
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// The table as text, one line per row after the header line, each ending in `\n`.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str(GAP);
                }
                let pad = widths[i] - width(cell);
                let last = i + 1 == n;
                match self.align[i] {
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                    Align::Left => {
                        line.push_str(cell);
                        if !last {
                            line.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Display width of a cell: its number of characters.
fn width(s: &str) -> usize {
    s.chars().count()
}

/// `s` cut to at most `max` characters, ending in `…` when cut; newlines become blanks.
pub fn truncate(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if width(&flat) <= max {
        return flat;
    }
    let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

// Writing to stdout (a closed reader is no error) and printing JSON: shared with
// `redrive-bench`.
pub use redrive_client::cli::{emit, print_json, quiet_broken_pipe};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_by_characters() {
        let mut t = Table::new(&[
            ("attempt", Align::Right),
            ("delay", Align::Left),
            ("note", Align::Left),
        ]);
        t.push(vec!["2".into(), "0s – 1s".into(), "".into()]);
        t.push(vec!["10".into(), "5s".into(), "late".into()]);
        assert_eq!(
            t.render(),
            "attempt  delay    note\n\
             \x20     2  0s – 1s\n\
             \x20    10  5s       late\n"
        );
    }

    #[test]
    fn short_rows_are_padded() {
        let mut t = Table::new(&[("a", Align::Left), ("b", Align::Left)]);
        t.push(vec!["x".into()]);
        assert_eq!(t.render(), "a  b\nx\n");
    }

    #[test]
    fn truncate_cuts_on_characters() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdefghij", 5), "abcd…");
        assert_eq!(truncate("重试重试重试", 3), "重试…");
        assert_eq!(truncate("a\nb", 5), "a b");
    }
}
