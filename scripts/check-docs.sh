#!/usr/bin/env bash
# Checks that the docs describe idem as it is:
#   * no stale phrase (a design file a clone does not contain, history, remarks about a machine)
#     in docs/, the top-level documents, the headers and the build files;
#   * no throughput figure in docs/ or README.md: figures live in BENCHMARKS.md, which the docs
#     link to by row;
#   * DESIGN-NOTES.md's sections are in number order, each number once, and its index lists each
#     section with its title and a status (current, amended by §N, superseded by §N).
# Usage: scripts/check-docs.sh   (from anywhere; exits 1 and names each finding)
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
fail() { echo "check-docs: $*" >&2; status=1; }

stale='DESIGN\.md|written before them|previous run|earlier build|other builds were running'
stale+='|development (VM|machine)|\.\./shared|/work/shared|loaded test VM'
while IFS= read -r hit; do
  fail "stale phrase: $hit"
done < <(git grep -n -I -E "$stale" -- 'docs/*.md' README.md BENCHMARKS.md DESIGN-NOTES.md \
  CHANGELOG.md '*.hpp' '*CMakeLists.txt' ':!scripts/check-docs.sh' || true)

while IFS= read -r hit; do
  fail "a figure outside BENCHMARKS.md (link to its row instead): $hit"
done < <(git grep -n -I -E "[0-9] ?(k|M) ?(/s|calls/s|events/s|req/s|rows/s|pairs/s)\b|[0-9] (calls|events|req|rows|pairs)/s\b" \
  -- 'docs/*.md' README.md || true)

python3 - <<'PY' || status=1
import re, sys
text = open('DESIGN-NOTES.md').read()
numbers = [int(n) for n in re.findall(r'(?m)^## (\d+)\. ', text)]
titles = dict((int(n), t) for n, t in re.findall(r'(?m)^## (\d+)\. (.*)$', text))
bad = False
def fail(msg):
    global bad
    print(f'check-docs: DESIGN-NOTES.md: {msg}', file=sys.stderr)
    bad = True
if numbers != sorted(numbers):
    fail('sections are not in number order: ' + ' '.join(map(str, numbers)))
if len(set(numbers)) != len(numbers):
    fail('a section number appears twice')
index = re.search(r'(?ms)^## Index\n(.*?)(?=^## \d+\. )', text)
if not index:
    fail('no "## Index" before the first section')
else:
    rows = re.findall(r'(?m)^\| (\d+) \| (.*) \| (.*) \|$', index.group(1))
    listed = {int(n): (t.replace('\\|', '|'), s) for n, t, s in rows}
    for n in numbers:
        if n not in listed:
            fail(f'§{n} is not in the index')
        elif listed[n][0] != titles[n]:
            fail(f'§{n}: the index says "{listed[n][0]}", the heading "{titles[n]}"')
    for n, (_, s) in listed.items():
        if n not in titles:
            fail(f'the index lists §{n}, which has no section')
        if not re.fullmatch(r'current|(amended|superseded) by §\d+(, §\d+)*', s):
            fail(f'§{n}: status "{s}" is not current / amended by §N / superseded by §N')
        for ref in re.findall(r'§(\d+)', s):
            if int(ref) not in titles:
                fail(f'§{n}: its status names §{ref}, which has no section')
sys.exit(1 if bad else 0)
PY
[ "$status" = 0 ] && echo "check-docs: OK"
exit "$status"
