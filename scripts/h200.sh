#!/usr/bin/env bash
# Everything the project measures on a lent GPU box in one call: build, GPU tests, agreement,
# a sweep, and asv across commits, offline.  Prints a short table last; full logs and results go to
# $OUT (one tarball, since the device tool returns at most 8 files).
#
#   bash scripts/h200.sh STEP...   steps run in order:
#     smoke         build, CUDA tests, relu2 info/check, SASS check, a small sweep
#     tests         build, CUDA tests, relu2 check, SASS check
#     inspect       relu2 inspect of the compiled paths, fused and triton on vLLM's shapes
#     levels        the instrument's hot figure of fused on fresh inputs, on one input and cycling over copies
#                   (scripts/hot_levels.py --instrument, three processes); records and report back in logs.tgz
#     asv=REV       relu2 asv run on REV (a commit, a branch, or an asv range A..B), offline, results kept;
#                   machine $RELU2_MACHINE (default the GPU's model: h200, h100) into $RELU2_RESULTS (default results);
#                   with RELU2_DEADLINE (epoch s), not started when under RELU2_STEP_S (200) s are left;
#                   RELU2_ASV_BENCH=REGEX passes --bench (with RELU2_BENCH_SUITES, one suite only)
#     demo=BASE,HEAD  asv on both under machine $MACHINE-demo (fused and copy only), then relu2 gate
#     gate=BASE,HEAD  relu2 gate on what asv= steps recorded (machine $RELU2_MACHINE), text and the spread;
#                   RELU2_GATE_ARGS adds arguments (e.g. --allow-missing 'ModelShapes.*')
#     confirm=BASE,HEAD  the gate's flagged cells measured again (relu2 confirm, timed), then the gate
#                   with --confirmed; its JSON files come back in logs.tgz
#     suites=NAMES  the asv= and compare= steps after it measure only these suites (RELU2_BENCH_SUITES
#                   and --bench; one suite), "suites=" all again
#     planted=PATCH a branch planted-NAME in the clone: main with docs/aa/PATCH applied and committed
#                   (NAME: the patch's name without .patch), for compare=main,planted-NAME; made once a
#                   box (a later call on the warm box keeps it)
#     compare=BASE,HEAD  relu2 compare BASE HEAD on this box (the checkout's instrument, the clone's
#                   commits; BASE,BASE is an A/A; a repeat on a warm box gets DIR-2, -3), timed; the
#                   folders come back in compare.tgz; the summary counts its short hot graphs (retried);
#                   with RELU2_DEADLINE, not started under RELU2_COMPARE_S (300) s left and stopped
#                   20 s before it (its rounds kept in DIR/rounds; the same compare= step in a later call on
#                   the warm box resumes it, relu2 compare --resume, instead of beginning again);
#                   RELU2_COMPARE_ARGS adds arguments (--measure-only: the A/As of a GPU with no model yet,
#                   which relu2 compare otherwise refuses before measuring); left unset on a GPU that no
#                   noise model judges, the step adds --measure-only itself and says so in the summary
#     sweep=ARGS    relu2 sweep ARGS --out $OUT/sweep (ARGS comma-free words joined by '+')
#     history=PATCH:K:CELL  a branch history-NAME in the clone: 16 commits after main (a line of docs each), the
#                   Kth also applying docs/aa/PATCH to csrc/; then relu2 bisect main history-NAME --cell CELL
#                   (IMPL:DTYPE:SHAPE:MODE), timed, its JSON report back in logs.tgz
#     counters=ARGS relu2 counters ARGS (words joined by '+') into counters-N/ (N counts the calls on this box);
#                   the folders come back in counters.tgz
#     truth=PATCH[:N]  the planted kernel's true slowdown, apart from relu2 compare: N (3) pairs of
#                   relu2 sweep --impl fused --modes hot,cold, one process each, alternating csrc/ and csrc/
#                   with docs/aa/PATCH applied (RELU2_CSRC_DIR), into truth-NAME/{main,planted}-I/; back in
#                   truth.tgz (python scripts/truth.py reads them)
#     counters-patch=PATCH[:ARGS]  the same, with the fused kernel built from csrc/ with docs/aa/PATCH applied
#                   (RELU2_CSRC_DIR), into counters-PATCHNAME-N/; ARGS default --impl+fused
#
# Expects, in the repository root: .whl/ holding asv and its dependencies (made here with
# `bash ../shared/tools/gpu-box-wheels.sh .whl virtualenv pytest-xdist`: pytest-xdist for the addopts of pyproject.toml) and .whl/repo.bundle, a git bundle of the
# repository (`git bundle create .whl/repo.bundle --all`; asv checks commits out of it).
# What travels (the tracked tree, docs/aa's data included, and .whl) must stay under the device tool's
# 64 MiB: only asv= steps need the virtualenv and pip wheels; leave them out of .whl otherwise. Nothing
# here reads docs/img or docs/aa's compare-* folders (only its patches): when the tree passes 64 MiB,
# remove them from the working tree for the call and `git checkout -- docs` after it.
# The box's own python3 (/opt/torch/.venv) has torch, triton, matplotlib, tqdm, pytest and ninja;
# asv, asv-tachyon and virtualenv go into /tmp/site from .whl/, on its PYTHONPATH, and this checkout's
# metadata into /tmp/relu2-self (the implementations under test are found through its entry points).
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
OUT=${OUT:-/tmp/relu2-out}
LOG=$OUT/logs
mkdir -p "$LOG"
# The box's torch lives in /opt/torch/.venv; a bare python3 on PATH may be the system one.
TORCH_BIN=${RELU2_TORCH_BIN:-/opt/torch/.venv/bin}
export PATH="$TORCH_BIN:$PATH"
export RELU2_CACHE_DIR=${RELU2_CACHE_DIR:-/tmp/relu2-cache}
export PYTHONPATH="$ROOT:/tmp/site:/tmp/relu2-self${PYTHONPATH:+:$PYTHONPATH}"
# The machine label asv results and compare folders carry: the lent GPU's model (h200, h100, gh200),
# never an H200's label on an H100's figures (the device tool may lend either); "gpu" where the name
# says neither, so no figure takes a label it has not earned.
gpu_label() {
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '\bg?h[0-9]{3}\b' | head -1 |
    tr 'A-Z' 'a-z'
}
MACHINE=${RELU2_MACHINE:-$(gpu_label)}
if [ -z "$MACHINE" ]; then
  MACHINE=gpu
  echo "h200.sh: no H100/H200 named by nvidia-smi: machine label '$MACHINE' (set RELU2_MACHINE to name it)" >&2
fi
COUNTERS=/tmp/relu2-counters
RESULTS=${RELU2_RESULTS:-results}
# The copied checkout belongs to another user than root here; git would refuse to read it.
git config --global --add safe.directory '*'

sync_head() {
  # The device tool's copy of the checkout has carried the git metadata of the session's first HEAD
  # under the files of a later one (a compare.json named its instrument <first HEAD>+dirty-...): point
  # the copy's HEAD and index at the bundle's HEAD, the commit these files are, so records name it.
  local want
  want=$(git -C "$ROOT" bundle list-heads "$ROOT/.whl/repo.bundle" HEAD 2>/dev/null | cut -d' ' -f1)
  [ -n "$want" ] && [ "$(git -C "$ROOT" rev-parse -q --verify HEAD)" != "$want" ] || return 0
  if git -C "$ROOT" fetch -q "$ROOT/.whl/repo.bundle" HEAD && git -C "$ROOT" reset -q "$want"; then
    echo "h200.sh: the checkout's git said HEAD $(git -C "$ROOT" rev-parse -q --verify ORIG_HEAD), its files are the bundle's $want: HEAD moved there"
  else
    echo "h200.sh: the checkout's HEAD is not the bundle's $want and could not be moved there: records name the older one"
  fi | tee -a "$LOG/summary.txt"
}
sync_head

relu2_with_asv() { python3 -m relu2 "$@"; }

step() { printf '\n== %s  (%s)\n' "$*" "$(date +%T)"; }
run() { local name=$1; shift; step "$name"; local t0=$SECONDS
  "$@" 2>&1 | tee "$LOG/$name.log"; local rc=${PIPESTATUS[0]}
  echo "-- $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$LOG/summary.txt"; return 0; }

install_self() {
  # The code runs from $ROOT (first on PYTHONPATH); the installed copy is there for its metadata: the
  # entry points of relu2.implementations (relu2/interface.py).
  [ -d /tmp/relu2-self ] && return 0
  install_asv && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/relu2-self "$ROOT"
}

install_asv() {
  # asv beside the box's torch (in /tmp/site); `relu2 asv run` points the benchmark environments at
  # that torch through a .pth file (asv.conf.json's first build_command) and they get everything else
  # from .whl, never the network.
  [ -d /tmp/site/asv ] && return 0
  python3 -m pip install -q --no-index --no-deps --find-links "$ROOT/.whl" --target /tmp/site \
    "$ROOT"/.whl/*.whl
}

sass() {
  # The kernels' loads and stores must be 16 bytes wide on the vector path.
  nvcc -arch=sm_90 -std=c++17 -O3 -c csrc/relu2_kernel.cu -o /tmp/relu2_kernel.o &&
  cuobjdump --dump-sass /tmp/relu2_kernel.o |
    awk '/Function :/ {f=$3} /LDG|STG/ {split($0, a, /[ ;]+/); for (i in a) if (a[i] ~ /^(LDG|STG)/) print f, a[i]}' |
    sed 's/_ZN[^ ]*relu2_kernelI//' | sort | uniq -c
}

tests() {
  run build python3 -m relu2 build
  run sass sass
  run pytest-cuda python3 -m pytest -m cuda -v -rs -p no:cacheprovider tests/
  run check python3 -m relu2 check
}

levels() {
  # Whether a tiny hot figure still follows the one address its input got (hot method 4 is meant to
  # take that out; docs/lab/results.md, "Hot method 4").
  mkdir -p "$LOG/levels"
  run build python3 -m relu2 build
  for i in 1 2 3; do run "levels-$i" python3 scripts/hot_levels.py --instrument "$LOG/levels/instrument.jsonl"; done
  run levels-report python3 scripts/hot_levels.py --report "$LOG/levels/instrument.jsonl"
}

smoke() {
  run env sh -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; nvcc --version | tail -1'
  run build python3 -m relu2 build
  run nvcc-resources bash .ci/nvcc_check.sh sm_90
  run info python3 -m relu2 info
  run check python3 -m relu2 check
  run pytest-cuda python3 -m pytest -m cuda -v -rs -p no:cacheprovider tests/
  run sweep-smoke python3 -m relu2 sweep --no-progress --dtype bfloat16 --sizes 2^10,2^16,2^20,2^24,2^28 \
      --out "$OUT/sweep-smoke"
}

too_late() {  # too_late STEP NEED VAR: under RELU2_DEADLINE, says "not started" when fewer than NEED s are left
  [ -n "${RELU2_DEADLINE:-}" ] || return 1
  local left=$(( RELU2_DEADLINE - $(date +%s) ))
  [ "$left" -lt "$2" ] || return 1
  echo "-- $1: not started, $left s left ($3 $2)" | tee -a "$LOG/summary.txt"
}

asv_run() {  # asv_run REV [MACHINE [RESULTS_DIR]]
  local rev=$1 machine=${2:-$MACHINE} results=${3:-$RESULTS} repo=/tmp/relu2-repo spec config
  # RELU2_DEADLINE (epoch seconds): a commit is not started when fewer than RELU2_STEP_S seconds
  # are left, so a call ends inside the device tool's limit with every started commit saved (an asv
  # run killed mid-commit loses that commit and can leave its workers measuring beside the next).
  too_late "asv-$machine-$rev" "${RELU2_STEP_S:-200}" RELU2_STEP_S && return 0
  install_asv || { echo "asv install failed"; return 1; }
  [ -d $repo ] || git clone -q "$ROOT/.whl/repo.bundle" $repo
  (cd $repo && git fetch -q "$ROOT/.whl/repo.bundle" '+refs/heads/*:refs/remotes/bundle/*' 2>/dev/null; true)
  config=$repo/asv.$machine.json  # beside the repo: asv resolves "repo": "." from it
  sed "s#\"results_dir\": \"results\"#\"results_dir\": \"$results\"#; s#\"html_dir\": \"html\"#\"html_dir\": \"html-$machine\"#" \
    "$ROOT/asv.conf.json" > "$config"
  # The checkout's results seed the clone's once a box: a later call on the same warm box gets the
  # checkout copied anew, whose older file of a commit measured again must not go back over it.
  local seeded=/tmp/relu2-seeded-$(echo "$results" | tr -c 'a-zA-Z0-9\n' '_')
  [ -e "$seeded" ] || { mkdir -p "$repo/$results" && cp -r "$ROOT/$results/." "$repo/$results/" 2>/dev/null; touch "$seeded"; }
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/.whl" PIP_CONFIG_FILE=/dev/null
  case $rev in *..*) spec=$rev ;; *) spec="$rev^!" ;; esac
  # asv exits 2 when any cell failed; the cells say which.  RELU2_ASV_TIMEOUT keeps the call
  # inside the device tool's limit, so what was recorded still comes back.
  run "asv-$machine-$(echo "$rev" | tr -c 'a-zA-Z0-9\n' '_' | cut -c1-24)" timeout "${RELU2_ASV_TIMEOUT:-540}" sh -c \
    "cd $repo && python3 -m relu2 asv run --config $config --machine '$machine' --show-stderr --record-samples ${RELU2_ASV_BENCH:+--bench '$RELU2_ASV_BENCH'} '$spec'"
  tar -C $repo -czf "$OUT/results-$machine.tgz" "$results"
}

clone() { [ -d /tmp/relu2-repo ] || git clone -q "$ROOT/.whl/repo.bundle" /tmp/relu2-repo; }

planted() {  # planted PATCH: main with docs/aa/PATCH applied, as branch planted-NAME of the clone
  local name=planted-${1%.patch} repo=/tmp/relu2-repo
  clone
  # Made once a box: a later call on the warm box keeps the commit, so a stopped compare of it resumes
  # (relu2 compare --resume refuses other commits) and a repeat compares the same head.
  run "$name" bash -c "cd $repo && if git rev-parse -q --verify refs/heads/$name >/dev/null; then echo 'kept from an earlier call:'; else
    git checkout -q -B $name main && git apply '$ROOT/docs/aa/$1' &&
    git -c user.name=relu2 -c user.email=relu2@localhost commit -qam 'planted: $1 (never merged)' &&
    git checkout -q main; fi && git log --oneline -1 $name"
}

# Whether relu2 compare would judge this GPU (its own check, relu2.runs.compare.check_judgeable), asked
# once a visit: the device may lend a GPU with no noise model, whose compares are then measured
# unjudged rather than refused.
# JUDGED: "yes", or the check's last line (why not).  Its exit status decides, not its output: a
# warning on stderr from a check that passed must not read as a refusal.
JUDGED=
judged() {
  if [ -z "$JUDGED" ]; then
    local why
    if why=$(python3 -c 'from relu2.runs.compare import check_judgeable; check_judgeable("cuda", None)' 2>&1 >/dev/null); then
      JUDGED=yes
    else
      JUDGED=$(printf '%s\n' "$why" | tail -1)
      JUDGED=${JUDGED:-the check failed without a word}
    fi
  fi
  [ "$JUDGED" = yes ]
}

compare_step() {  # compare_step BASE,HEAD
  local base=${1%,*} head=${1#*,} repo=/tmp/relu2-repo folders=/tmp/relu2-compare
  local name
  name=$MACHINE-$(echo "$1" | tr -c 'a-zA-Z0-9\n' '_')
  # A second compare of the same refs on a warm box (another A/A) gets a folder of its own: -2, -3, ...;
  # but where the last of them was stopped by a deadline (compare.json complete false), the step goes on
  # with it (relu2 compare --resume: its rounds kept, only the rest measured) rather than begin again.
  local n=1 first=$name last resume=
  while [ -e "$folders/$name" ]; do last=$name; n=$((n + 1)); name=$first-$n; done
  if [ -n "${last:-}" ] && python3 -c 'import sys, pathlib; from relu2.records.compare_folder import incomplete
incomplete(pathlib.Path(sys.argv[1]))' "$folders/$last" 2>/dev/null; then  # relu2 compare --resume's own check
    name=$last resume=--resume
  fi
  install_asv && clone || { echo "compare needs asv and the clone"; return 1; }
  # Under RELU2_DEADLINE a compare is not started with fewer than RELU2_COMPARE_S (300) s left, and is
  # stopped 20 s before it (its rounds so far are kept, compare.json complete false), so the call
  # returns its folders inside the device tool's limit.
  too_late "compare-$name" $(( ${RELU2_COMPARE_S:-300} + 20 )) RELU2_COMPARE_S+20 && return 0
  local limit=${RELU2_ASV_TIMEOUT:-540}
  [ -z "${RELU2_DEADLINE:-}" ] || limit=$(( RELU2_DEADLINE - $(date +%s) - 20 ))
  mkdir -p $folders
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/.whl" PIP_CONFIG_FILE=/dev/null
  # From $ROOT, not the clone: `python3 -m` puts the current folder first on sys.path, and the
  # instrument must be this checkout's (the clone's relu2 is whatever the bundle held).
  local args=${RELU2_COMPARE_ARGS-}
  if [ -z "${RELU2_COMPARE_ARGS+set}" ] && ! judged; then
    args=--measure-only
    echo "-- compare-$name: measured unjudged (--measure-only): ${JUDGED#*UsageError: }" | tee -a "$LOG/summary.txt"
  fi
  [ -z "$resume" ] || echo "-- compare-$name: resumed (stopped before; relu2 compare --resume)" | tee -a "$LOG/summary.txt"
  run "compare-$name" bash -c "cd $ROOT && t0=\$SECONDS; timeout -s INT $limit python3 -m relu2 compare $base $head --repo $repo --machine $MACHINE \
    ${RELU2_BENCH_SUITES:+--suites $RELU2_BENCH_SUITES} $args $resume --out $folders/$name; rc=\$?; echo compare exit \$rc in \$((SECONDS - t0)) s; exit \$rc"
  # The timer's notes of short hot graphs (relu2 compare passes them on; the text is relu2.measure.timing's
  # HOT_NOTE and its print): one a short graph, measured again unless it was the cell's last try.
  echo "-- compare-$name: $(grep -c 'relu2: hot: a graph of' "$LOG/compare-$name.log") short hot graphs noted," \
    "$(grep -c 'relu2: hot: a graph of.*(try 3 of 3)' "$LOG/compare-$name.log") of them kept after the last try" >> "$LOG/summary.txt"
  tar -C $folders -czf "$OUT/compare.tgz" .
}

history() {  # history PATCH:K:CELL: a 16-commit history with a kernel change at commit K, bisected
  local patch=${1%%:*} rest=${1#*:} k cell name repo=/tmp/relu2-repo
  k=${rest%%:*} cell=${rest#*:} name=history-${patch%.patch}
  clone
  run "$name" bash -c "cd $repo && git checkout -q -B $name main && for i in \$(seq 1 16); do
      echo \"history commit \$i\" >> docs/aa/history.txt; git add docs/aa/history.txt;
      [ \$i = $k ] && git apply '$ROOT/docs/aa/$patch' && git add -A csrc;
      git -c user.name=relu2 -c user.email=relu2@localhost commit -qm \"history \$i\$([ \$i = $k ] && echo ': $patch')\"; done &&
    git checkout -q main && git log --oneline main..$name | tail -n +1"
  run "bisect-$name" bash -c "cd $ROOT && t0=\$SECONDS; python3 -m relu2 bisect main $name --repo $repo --cell '$cell' \
    --format json --state /tmp/relu2-bisect-$name.json > $LOG/bisect-$name.json; rc=\$?; echo bisect exit \$rc in \$((SECONDS - t0)) s;
    python3 -c \"import json; r = json.load(open('$LOG/bisect-$name.json')); print('counted commits', r['counted_commits'], '| measured steps', r['measured_steps']); [print(c['cell'], c['verdict'], c['by'], c['first_bad'], c.get('work')) for c in r['cells']]\"; exit \$rc"
}

counters_step() {  # counters_step NAME ARGS: relu2 counters ARGS into $COUNTERS/NAME-N
  local name=$1 args=$2 n=1
  too_late "counters-$name" "${RELU2_COUNTERS_S:-150}" RELU2_COUNTERS_S && return 0
  mkdir -p "$COUNTERS"
  while [ -e "$COUNTERS/$name-$n" ]; do n=$((n + 1)); done
  run "counters-$name-$n" bash -c "t0=\$SECONDS; python3 -m relu2 counters ${args//+/ } --out $COUNTERS/$name-$n; rc=\$?; echo counters exit \$rc in \$((SECONDS - t0)) s; exit \$rc"
  tar -C "$COUNTERS" -czf "$OUT/counters.tgz" .
}

counters_patch() {  # counters_patch PATCH[:ARGS]: fused built from csrc/ with docs/aa/PATCH applied
  local patch=${1%%:*} args=--impl+fused src
  [ "$1" != "$patch" ] && args=${1#*:}
  src=$(patched_csrc "$patch") || { echo "-- counters-$patch: the patch does not apply" | tee -a "$LOG/summary.txt"; return 0; }
  RELU2_CSRC_DIR=$src counters_step "${patch%.patch}" "$args"
}

patched_csrc() {  # patched_csrc PATCH: a copy of csrc/ with docs/aa/PATCH applied; prints its folder
  local src=/tmp/relu2-csrc-${1%.patch}
  [ -d "$src" ] || { mkdir -p "$src" && cp -r "$ROOT/csrc" "$src/" && (cd "$src" && git apply "$ROOT/docs/aa/$1"); } || return 1
  echo "$src/csrc"
}

truth() {  # truth PATCH[:N]
  local patch=${1%%:*} n=3 src dir i
  [ "$1" != "$patch" ] && n=${1#*:}
  src=$(patched_csrc "$patch") || { echo "-- truth-$patch: the patch does not apply" | tee -a "$LOG/summary.txt"; return 0; }
  dir=/tmp/relu2-truth/truth-${patch%.patch}
  for i in $(seq 1 "$n"); do
    too_late "truth-${patch%.patch}-$i" "${RELU2_TRUTH_S:-60}" RELU2_TRUTH_S && break
    run "truth-main-$i" python3 -m relu2 sweep --impl fused --modes hot,cold --no-progress --out "$dir/main-$i"
    run "truth-planted-$i" env RELU2_CSRC_DIR="$src" python3 -m relu2 sweep --impl fused --modes hot,cold --no-progress --out "$dir/planted-$i"
  done
  tar -C /tmp/relu2-truth -czf "$OUT/truth.tgz" .
  run "truth-table-${patch%.patch}" python3 scripts/truth.py "$dir"
}

inspect_all() {
  for args in "compile_dynamic --shape 2048x12288" "compile_model --shape 2048x12288 --no-source" \
              "compile_dim0 --shape 2048x12288 --no-source" "compile_dynamic --shape 16384x12288 --no-source" \
              "compile_dynamic --shape 2048x3712 --no-source" "vllm_cuda --shape 2048x12288" \
              "fused --shape 19418x13824" "triton --shape 19418x13824"; do
    run "inspect-$(echo "$args" | tr -c 'a-zA-Z0-9\n' '_' | cut -c1-40)" python3 -m relu2 inspect $args
  done
}

demo() {  # demo BASE,HEAD
  # Issue 6's proof on real data: BASE and a deliberately slower HEAD, fused and copy only, under a
  # machine name and a results folder of their own (its benchmarks.json has fewer parameters than
  # the main one's), then the gate on (BASE, HEAD) and on (BASE, BASE).
  local base=${1%,*} head=${1#*,} repo=/tmp/relu2-repo
  [ -d $repo ] || git clone -q "$ROOT/.whl/repo.bundle" $repo
  export RELU2_BENCH_IMPLS=fused,copy
  asv_run "$base" "$MACHINE-demo" results-demo
  asv_run "$head" "$MACHINE-demo" results-demo
  unset RELU2_BENCH_IMPLS
  tar -C $repo -czf "$OUT/results-demo.tgz" results-demo
  run gate-slower bash -c "cd $repo && $(declare -f relu2_with_asv); relu2_with_asv gate $base $head --results results-demo --machine $MACHINE-demo; echo gate exit \$?"
  run gate-equal bash -c "cd $repo && $(declare -f relu2_with_asv); relu2_with_asv gate $base $base --results results-demo --machine $MACHINE-demo; echo gate exit \$?"
}

confirm_step() {  # confirm_step BASE,HEAD
  # What CI does on a flagged gate (.github/workflows/benchmarks.yml): the flagged cells measured again,
  # base and head in fresh interleaved processes from worktrees of both commits, then the confirmed gate.
  local base=${1%,*} head=${1#*,} repo=/tmp/relu2-repo j=$LOG/confirm-${1//[^a-zA-Z0-9]/_}
  run "confirm-${1//[^a-zA-Z0-9]/_}" bash -c "cd $repo && \
    python3 -m relu2 gate $base $head --results $RESULTS --machine $MACHINE ${RELU2_GATE_ARGS:-} --format json > $j.gate.json; \
    echo flagged gate exit \$?; t0=\$SECONDS; \
    python3 -m relu2 confirm $base $head --from-gate $j.gate.json --machine $MACHINE --out $j.json; \
    echo confirm exit \$? in \$((SECONDS - t0)) s; \
    python3 -m relu2 gate $base $head --results $RESULTS --machine $MACHINE ${RELU2_GATE_ARGS:-} --confirmed $j.json; \
    echo confirmed gate exit \$?"
}

install_self || { echo "installing the checkout (entry points) failed"; exit 1; }
for step in "${@:-smoke}"; do
  case $step in
    smoke) smoke ;;
    tests) tests ;;
    inspect) inspect_all ;;
    levels) levels ;;
    asv=*) asv_run "${step#asv=}" ;;
    demo=*) demo "${step#demo=}" ;;
    gate=*) pair=${step#gate=}
            run "gate-${pair//[^a-zA-Z0-9]/_}" bash -c "cd /tmp/relu2-repo && python3 -m relu2 gate ${pair%,*} ${pair#*,} --results $RESULTS --machine $MACHINE --spread ${RELU2_GATE_ARGS:-}; echo gate exit \$?" ;;
    confirm=*) confirm_step "${step#confirm=}" ;;
    planted=*) planted "${step#planted=}" ;;
    compare=*) compare_step "${step#compare=}" ;;
    suites=*) if [ -n "${step#suites=}" ]; then export RELU2_BENCH_SUITES=${step#suites=} RELU2_ASV_BENCH=${step#suites=}
              else unset RELU2_BENCH_SUITES RELU2_ASV_BENCH; fi ;;
    counters=*) counters_step grid "${step#counters=}" ;;
    counters-patch=*) counters_patch "${step#counters-patch=}" ;;
    history=*) history "${step#history=}" ;;
    truth=*) truth "${step#truth=}" ;;
    sweep=*) args=${step#sweep=}; run sweep python3 -m relu2 sweep --no-progress ${args//+/ } --out "$OUT/sweep" ;;
    *) echo "usage: $0 [smoke | tests | inspect | levels | asv=REV | demo=BASE,HEAD | gate=BASE,HEAD | confirm=BASE,HEAD | planted=PATCH | compare=BASE,HEAD | suites=NAMES | sweep=ARG+ARG... | counters=ARG+ARG... | counters-patch=PATCH[:ARG+ARG...] | history=PATCH:K:CELL | truth=PATCH[:N]]..." >&2; exit 2 ;;
  esac
done
if [ -d "/tmp/relu2-repo/$RESULTS" ]; then
  (cd /tmp/relu2-repo && python3 -m asv publish --config "asv.$MACHINE.json" >/dev/null 2>&1 &&
   echo "asv publish: ok" | tee -a "$LOG/summary.txt")
  relu2_with_asv export "/tmp/relu2-repo/$RESULTS" --out "$OUT/export.csv" --force  # a later run in one call exports again
fi
logs_tgz=$OUT/logs.tgz n=1  # a second run in one call keeps the first one's logs beside its own
while [ -e "$logs_tgz" ]; do n=$((n + 1)); logs_tgz=$OUT/logs-$n.tgz; done
tar -C "$OUT" -czf "$logs_tgz" logs $(cd "$OUT" && ls -d sweep* 2>/dev/null)
step summary
cat "$LOG/summary.txt"
rm -rf "$LOG" "$OUT"/sweep*
