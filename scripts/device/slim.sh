#!/bin/bash
# The lent GPU machine receives every tracked file of the checkout, 64 MiB at most (the .deb files of
# .deps included); the tree with its test data and demo models is larger. For one run, untrack what
# it does not need ("scripts/device/slim.sh on tests/data/tokenizers/qwen3
# examples/models/spark-demo-coder-next"), then track it again ("scripts/device/slim.sh off").
# The paths go to .git/info/exclude meanwhile. Never commit while slimmed.
set -e
cd "$(dirname "$0")/../.."
state=.git/spark-slimmed
case "$1" in
on)
    shift
    [ -f $state ] && { echo "already slimmed: $(cat $state)"; exit 1; }
    for p in "$@"; do git rm -r -q --cached "$p"; echo "/$p" >> .git/info/exclude; done
    printf '%s\n' "$@" > $state ;;
off)
    [ -f $state ] || exit 0
    while read -r p; do
        grep -vxF "/$p" .git/info/exclude > .git/info/exclude.tmp || true
        mv .git/info/exclude.tmp .git/info/exclude
        git add -f "$p"
    done < $state
    rm $state
    git status --short | head ;;
esac
git ls-files -z | xargs -0 du -cb | tail -1
