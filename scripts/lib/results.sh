# Sourced by scripts/bench and scripts/bench-counts: writes a run's generated tables into
# docs/results/NAME.md, which docs/benchmarks.md links. The file is replaced whole: nothing in
# it is written by hand, and the figures quoted in docs/benchmarks.md come from it.

RESULTS_DIR=docs/results

# write_results NAME FILE TITLE WRITER: docs/results/NAME.md gets a heading (TITLE), a line
# naming the command that writes it (WRITER), then FILE's lines.
write_results() {
    local name=$1 file=$2 title=$3 writer=$4
    local out=$RESULTS_DIR/$name.md
    mkdir -p "$RESULTS_DIR"
    {
        printf '# %s\n\n' "$title"
        printf 'Written by `%s`, which replaces this file at its next run. ' "$writer"
        printf 'What the scenarios are and how to read the tables: [Benchmarks](../benchmarks.md).\n\n'
        cat "$file"
    } >"$out.new"
    mv "$out.new" "$out"
    echo "wrote $file into $out" >&2
}
