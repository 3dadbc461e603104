#!/bin/bash
# The quickstart's console output at two commits, diffed: a refactoring that claims "behaviour unchanged" shows an
# empty diff here (every [batch N/250] line: losses, lr, grad norm; eval and ICL lines; checkpoint lines).
#   bash benchmarks/quickstart_console_diff.sh OLD_COMMIT NEW_COMMIT     (about 3 minutes per commit on 2 cores)
# Each commit runs `llmfoundry train yamls/quickstart.yaml` from a worktree of its own, as the getting-started
# guide runs it (from the checkout's root), with its own freshly prepared data.
set -u
repo=$(git rev-parse --show-toplevel)
out=$(mktemp -d)
for commit in "$1" "$2"; do
  tree="$out/tree-$commit"
  git -C "$repo" worktree add -q "$tree" "$commit"
  (cd "$tree" && PYTHONPATH="$tree" python3 -m llmfoundry.cli train yamls/quickstart.yaml progress_bar=false \
    > "$out/$commit.txt" 2> "$out/$commit.err") || { echo "$commit: exit $? (see $out/$commit.err)"; exit 1; }
  git -C "$repo" worktree remove --force "$tree"
done
echo "$(wc -l < "$out/$1.txt") lines at $1, $(wc -l < "$out/$2.txt") at $2"
if diff "$out/$1.txt" "$out/$2.txt"; then echo "identical console output"; else exit 1; fi
