# Sourced by scripts/bench and scripts/bench-counts: writes generated tables into
# docs/benchmarks.md, between the lines
#     <!-- begin generated: NAME -->
#     <!-- end generated: NAME -->
# (the regions may nest: the full run's region holds the counts' region). A region that is not
# there yet is appended at the end of the file, under a heading.

BENCH_DOC=docs/benchmarks.md

# doc_region NAME FILE [HEADING]: replace region NAME's lines with FILE's.
doc_region() {
    local name=$1 file=$2 heading=${3:-}
    local begin="<!-- begin generated: $name -->" end="<!-- end generated: $name -->"
    if ! grep -qxF "$begin" "$BENCH_DOC" || ! grep -qxF "$end" "$BENCH_DOC"; then
        {
            echo
            [[ -n "$heading" ]] && printf '## %s\n\n' "$heading"
            echo "$begin"
            echo "$end"
        } >>"$BENCH_DOC"
    fi
    awk -v begin="$begin" -v end="$end" -v file="$file" '
        $0 == begin { print; while ((getline line < file) > 0) print line; skip = 1; next }
        $0 == end { skip = 0 }
        !skip { print }' "$BENCH_DOC" >"$BENCH_DOC.new"
    mv "$BENCH_DOC.new" "$BENCH_DOC"
    echo "wrote $file into $BENCH_DOC (region '$name')" >&2
}
