//! The crate's layers, read from its source: `model` < `proto` < `engine` < `runtime` < `api`,
//! each folder of `src/` naming only its own layer and those below it (see the comment on the
//! layers in `src/lib.rs`). A path `crate::<layer>::…`, or a root re-export (`crate::Redlock`)
//! of a higher layer, in a file of a lower one fails this test with the file and the line.
//! Comments and the inline `#[cfg(test)] mod tests` are left out: a test may reach anywhere.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

const LAYERS: [&str; 5] = ["model", "proto", "engine", "runtime", "api"];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == layer)
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and its inline test module.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let end = text.find("\n#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.split("//").next().unwrap_or("")))
        .filter(|(_, l)| !l.trim().is_empty())
        .collect()
}

/// Each name the crate root re-exports (`pub use api::redlock::Redlock;`), with its layer.
fn root_names(lib: &str) -> HashMap<String, usize> {
    let mut names = HashMap::new();
    let mut statement = String::new();
    for line in lib.lines() {
        if statement.is_empty() && !line.starts_with("pub use ") {
            continue;
        }
        statement.push_str(line);
        if !line.trim_end().ends_with(';') {
            continue;
        }
        let path = statement
            .trim_start_matches("pub use ")
            .trim_end_matches(';');
        let layer = path.split("::").next().unwrap_or("");
        if let Some(r) = rank(layer) {
            let tail = path.rsplit("::").next().unwrap_or("");
            let list = tail.trim_start_matches('{').trim_end_matches('}');
            let list = if path.contains('{') {
                &path[path.find('{').unwrap() + 1..path.rfind('}').unwrap()]
            } else {
                list
            };
            for name in list.split(',') {
                let name = name.trim();
                let name = name.rsplit(" as ").next().unwrap_or(name).trim();
                if !name.is_empty() {
                    names.insert(name.to_owned(), r);
                }
            }
        }
        statement.clear();
    }
    names
}

#[test]
fn no_layer_names_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_names(&fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(
        roots.get("Redlock") == Some(&4) && roots.get("Lock") == Some(&0),
        "the root re-exports were not read: {roots:?}"
    );
    let mut found = Vec::new();
    let mut checked = 0;
    for (own, layer) in LAYERS.iter().enumerate() {
        let mut list = Vec::new();
        files(&src.join(layer), &mut list);
        assert!(!list.is_empty(), "src/{layer}/ has no files");
        for file in list {
            let text = fs::read_to_string(&file).unwrap();
            for (n, line) in code_lines(&text) {
                checked += 1;
                for (at, _) in line.match_indices("crate::") {
                    let rest = &line[at + "crate::".len()..];
                    let word: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let target = rank(&word).or_else(|| roots.get(&word).copied());
                    if let Some(t) = target.filter(|t| *t > own) {
                        found.push(format!(
                            "{}:{n}: {layer} names {} ({})",
                            file.strip_prefix(&src).unwrap().display(),
                            word,
                            LAYERS[t]
                        ));
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "only {checked} lines of code read");
    assert!(
        found.is_empty(),
        "imports up the layers:\n{}",
        found.join("\n")
    );
}
