#!/usr/bin/env bash
# The macOS build, checked on Linux (`./dev lint --only macos`, and .ci/run
# on every CI run): what a Mac would refuse fails here first.
#
#   scripts/macos_check.sh ROOT [FILE.cc ...]
#   (no files: every one; with files, the plugin is linked when one of
#   them is in runtime/, model/ or base/)
#
#  1. The shell scripts macOS runs (./dev and what `./dev run`, `./dev
#     test` and `./dev lint` call) against bash 3.2, macOS's /bin/bash:
#     scripts/bash32_check.py says what that catches and what it cannot.
#  2. Every C++ file of the tree (git ls-files '*.cc', tests and benchmarks
#     included) compiled for aarch64-macos 14.0 (torch 2.13's least macOS)
#     with macOS's C library headers (zig's copy of the SDK's) and libc++,
#     syntax and semantics only (-fsyntax-only: templates are instantiated,
#     nothing is generated), with the headers of the macOS torch wheel and
#     of Debian's packages for the portable libraries. A call macOS lacks
#     fails (undeclared), and so does one newer than macOS 14 (pipe2 is
#     declared, for macOS 27: -Werror=unguarded-availability). With them,
#     the C++ protoc makes of rpc/oip.proto (generated/rpc/oip.pb.cc and
#     oip.grpc.pb.cc, made here as the build makes them).
#  3. The torch plugin (runtime/CMakeLists.txt: aotid_torch, from
#     runtime/aoti_model.cc and model/tensor.cc with aotid_base) compiled
#     and linked as a Mach-O for arm64 against the wheel's real
#     libtorch.dylib, libtorch_cpu.dylib and libc10.dylib: a symbol none of
#     them exports fails the link (no -undefined dynamic_lookup), and the
#     plugin must export its entry point.
#
# Not checked, and why:
#  - linking the aotid binary and the tests: they need libuv, libzip,
#    sqlite, OpenSSL, pcre2, gRPC, protobuf, abseil and GoogleTest built
#    for macOS, which no registry this project reaches carries (Homebrew's
#    bottles are not reachable); the macOS workflow links and runs them.
#  - zig links its own libc++ into the plugin (Apple's linker takes
#    /usr/lib/libc++.1.dylib); the torch symbols are what this link proves.
#  - zig's clang is newer than Apple's, and its libc++ has Apple's
#    availability annotations off: a libc++ feature too new for macOS 14
#    passes here.
#  - -fno-cxx-modules: zig's clang reports __has_feature(modules) under
#    -std=c++20, which makes the SDK's <math.h> pull a part of <float.h> only
#    and hides FLT_MAX from everything after it (toml++, GoogleTest). Apple's
#    clang does not build C++20 that way by default.
#  - Third-party headers are Debian's (a curated folder of links, never
#    /usr/include whole, which would bring glibc's): the same upstream
#    versions' portable headers. Two are generated per machine: zipconf.h
#    (integer types only, LP64: the same on arm64 macOS) and OpenSSL's
#    configuration.h (Debian's feature switches and the word size; the
#    check requires SIXTY_FOUR_BIT_LONG, true of arm64 macOS as of x86_64
#    Linux; aotid uses only EVP digests, which no switch there removes).
#  - gRPC's, protobuf's and abseil's headers are Debian's too (gRPC 1.51,
#    protobuf 3.21, abseil 20220623; abseil because gRPC 1.51's headers
#    include it, protobuf 3.21's do not), and so is the protoc, with gRPC's
#    grpc_cpp_plugin, that makes rpc/oip.pb.h and oip.grpc.pb.h into this
#    check's own generated/rpc/ (the build's are in the build folder). What
#    this proves: aotid's gRPC code and the generated code compile on
#    macOS's side of those headers' platform switches (the __APPLE__ branch
#    of grpc/support/port_platform.h, which must define
#    GPR_SUPPORT_CHANNELS_FROM_FD for grpc::AddInsecureChannelFromFd, which
#    rpc/server.cc hands its connections to). What it cannot: Homebrew's
#    versions are much newer (gRPC 1.7x, protobuf 3x whose generated code
#    uses abseil): a call those removed or changed passes here; the macOS
#    workflow builds and links against them.
#
# Files left out of step 2 (each with its reason; none is left out
# silently):
#  - tests/runner/hostile_model.c: C, not C++; built by the sandbox tests,
#    which are Linux's (tests/e2e/security_test.cc).
#
# Tools, in a cache of their own (not the dev venv, whose path keys the
# build): $AOTID_MACOS_CHECK_CACHE, default ~/.cache/aotid-dev/macos-check:
# a venv with PyPI's ziglang (pinned), the macOS arm64 torch wheel's
# include/ and the four dylibs the plugin links, zig's own cache (its libc++
# for the target, built once). Made once, reused after.
set -euo pipefail
root="$(cd "${1:?usage: scripts/macos_check.sh ROOT [FILE.cc ...]}" && pwd)"
shift
ZIG_PIN="0.17.0"
TORCH_PIN="2.13.0"
# torch 2.13's macOS wheels are tagged macosx_14_0_arm64 (none for 11.0).
TORCH_PLATFORM="macosx_14_0_arm64"
TARGET="aarch64-macos.14.0"
cache="${AOTID_MACOS_CHECK_CACHE:-$HOME/.cache/aotid-dev/macos-check}"
tools="$cache/zig${ZIG_PIN}-torch${TORCH_PIN}"
jobs="${AOTID_JOBS:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}"
started=$SECONDS

say() { printf 'macos: %s\n' "$*"; }
die() { printf 'macos: %s\n' "$*" >&2; exit 1; }

# --- tools ------------------------------------------------------------------
need_tools() {
  [[ -f "$tools/.complete" ]] && return 0
  say "setting up $tools (once: ziglang $ZIG_PIN, the macOS torch $TORCH_PIN wheel's headers and dylibs)"
  local tmp="$tools.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  python3 -m venv "$tmp/venv" || die "python3 -m venv failed (Debian: python3-venv)"
  "$tmp/venv/bin/pip" install -q --disable-pip-version-check "ziglang==$ZIG_PIN" ||
    die "cannot install ziglang==$ZIG_PIN from PyPI"
  "$tmp/venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform "$TORCH_PLATFORM" --python-version 3.11 "torch==$TORCH_PIN" -d "$tmp/wheel" ||
    die "cannot download torch==$TORCH_PIN for $TORCH_PLATFORM from PyPI"
  "$tmp/venv/bin/python" - "$tmp" <<'EOF'
import glob, os, sys, zipfile
tmp = sys.argv[1]
(wheel,) = glob.glob(os.path.join(tmp, "wheel", "torch-*.whl"))
libs = {"torch/lib/" + n for n in ("libc10.dylib", "libtorch.dylib", "libtorch_cpu.dylib", "libomp.dylib")}
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("torch/include/") or n in libs]
    missing = libs - set(names)
    if missing:
        sys.exit("the wheel lacks " + ", ".join(sorted(missing)))
    z.extractall(tmp, names)
EOF
  rm -rf "$tmp/wheel"
  touch "$tmp/.complete"
  # Another run may have finished first: keep one.
  mv -T "$tmp" "$tools" 2>/dev/null || rm -rf "$tmp"
}

# The curated include folder: links to Debian's headers of the portable
# libraries aotid uses, each named; and the two generated headers.
make_includes() {
  local inc="$1" h
  rm -rf "$inc"
  mkdir -p "$inc/third_party/openssl" "$inc/generated/platform" "$inc/generated/daemon"
  mkdir -p "$inc/third_party/google"
  for h in uv.h uv httplib.h toml++ sqlite3.h nlohmann CLI zip.h zipconf.h gtest gmock simdjson.h \
    pcre2.h zlib.h zconf.h brotli grpcpp grpc google/protobuf absl; do
    [[ -e "/usr/include/$h" ]] || die "/usr/include/$h is missing (./dev installs Debian's packages: run ./dev build)"
    ln -s "/usr/include/$h" "$inc/third_party/$h"
  done
  for h in /usr/include/openssl/*.h; do ln -s "$h" "$inc/third_party/openssl/"; done
  local conf
  conf="$(ls /usr/include/*-linux-gnu/openssl/configuration.h 2>/dev/null | head -1)"
  [[ -n "$conf" ]] || die "no OpenSSL configuration.h (Debian: libssl-dev)"
  grep -q 'define SIXTY_FOUR_BIT_LONG' "$conf" ||
    die "$conf is not for an LP64 machine: it cannot stand in for macOS arm64's"
  ln -s "$conf" "$inc/third_party/openssl/configuration.h"
  ln -s "$(dirname "$conf")/opensslconf.h" "$inc/third_party/openssl/opensslconf.h"
  sed "s/@AOTID_TORCH_VERSION@/$TORCH_PIN/" "$root/platform/torch_version.h.in" >"$inc/generated/platform/torch_version.h"
  # daemon/CMakeLists.txt compiles the service templates in; their text
  # does not matter to the compiler, their list does.
  "$python" - "$root" "$inc/generated/daemon/service_templates.inc" <<'EOF'
import re, sys
root, out = sys.argv[1], sys.argv[2]
cmake = open(root + "/daemon/CMakeLists.txt").read()
names = re.search(r"set\(_service_templates([^)]*)\)", cmake).group(1).split()
with open(out, "w") as f:
    for n in names:
        f.write('{"%s", R"aotid_template(%s)aotid_template"},\n' % (n, open(root + "/" + n).read()))
EOF
}

# rpc/oip.proto made into C++ as rpc/CMakeLists.txt makes it (Debian's
# protoc and gRPC's plugin, -I rpc/), under generated/rpc/: the sources
# include "rpc/oip.pb.h" and "rpc/oip.grpc.pb.h" from there.
generate_rpc() {
  local out="$1/generated/rpc" protoc plugin
  protoc="$(command -v protoc)" || die "no protoc (Debian: protobuf-compiler; run ./dev build)"
  plugin="$(command -v grpc_cpp_plugin)" || die "no grpc_cpp_plugin (Debian: protobuf-compiler-grpc; run ./dev build)"
  mkdir -p "$out"
  "$protoc" -I "$root/rpc" --cpp_out "$out" --grpc_out "$out" --plugin="protoc-gen-grpc=$plugin" \
    "$root/rpc/oip.proto" || die "protoc failed on rpc/oip.proto"
}

need_tools
python="$tools/venv/bin/python"
zig="$("$python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')"
export ZIG_GLOBAL_CACHE_DIR="$tools/zig-cache" ZIG_LOCAL_CACHE_DIR="$tools/zig-cache"
work="$cache/run"
mkdir -p "$cache"
rm -rf "$work"
mkdir -p "$work/logs" "$work/obj"
make_includes "$work/include"
generate_rpc "$work/include"
torch="$tools/torch"
cd "$root"
failed=()

# --- 1. the shell scripts ---------------------------------------------------
# What macOS runs: ./dev, the scripts it calls for run, test and lint, and
# the ones ctest runs there. Left out: .ci/run (Linux CI), the Linux-only
# tests' scripts (tests/verify_unit.sh, tests/install/wheel_test.sh and the
# two it calls: CMake registers them on Linux only), tests/fuzz/*.sh (no
# libFuzzer in Apple's clang: registered on Linux only) and bench/*.sh
# (benchmarks of this Linux machine: /proc, nproc, sha256sum).
shell_scripts=(dev scripts/run-default.sh scripts/lint.sh scripts/macos_check.sh tests/export_demo.sh
  tests/install/exporter_test.sh)
if ! "$python" "$root/scripts/bash32_check.py" "${shell_scripts[@]}"; then
  failed+=("bash 3.2")
fi

# --- 2. every C++ file --------------------------------------------------------
flags=(-target "$TARGET" -std=c++20 -fno-cxx-modules -Wall -Wextra -Wno-unused-parameter
  -Werror=unguarded-availability -Werror=unguarded-availability-new
  -I"$root" -I"$root/tests" -I"$work/include/generated"
  -isystem "$work/include/third_party" -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include"
  -DAOTID_VERSION='"0.1.0"' -DAOTID_TORCH_PLUGIN_NAME='"libaotid_torch.so"'
  -DAOTID_TESTDATA='"/testdata"' -DAOTID_SOURCE_DIR='"/source"' -DAOTID_FAKE_RUNNER='"/fake_runner"' -DAOTID_PYTHON='"/python"'
  -DAOTID_BINARY='"/aotid"' -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT)

# zig c++ -fsyntax-only exits 1 after a clean parse, failing to move the
# object it never wrote into its cache; that line and its note about -c
# are zig's own and dropped. A file fails on any other error. It also
# leaves an empty a.out where it runs: it runs in $work, not the checkout.
# Run by xargs in a child bash: the flags come from $work/flags (arrays do
# not cross into a child).
compile_one() {
  local f="$1" log="$work/logs/${1//\//_}.log" args=() line src="$root/$1"
  while IFS= read -r line; do args+=("$line"); done <"$work/flags"
  [[ "$f" == bench/codec_bench.cc ]] && args+=(-DAOTID_BENCH_SIMDJSON=1)  # as with Homebrew's simdjson
  [[ "$f" == generated/* ]] && src="$work/include/$f"  # protoc's, not the tree's
  (cd "$work" && "$zig" c++ ${args[@]+"${args[@]}"} -fsyntax-only "$src") >"$log.raw" 2>&1 || true
  grep -vE "failed to rename '.*' into '.*': FileNotFound|argument unused during compilation: '-c'" \
    "$log.raw" >"$log" || true
  rm -f "$log.raw"
  if grep -qE '(^|: )(fatal )?error:' "$log"; then echo "FAIL $f"; else echo "ok   $f"; fi
}

if (($#)); then
  sources=("$@")
else
  sources=()
  while IFS= read -r f; do sources+=("$f"); done < <(git ls-files -- '*.cc')
  sources+=(generated/rpc/oip.pb.cc generated/rpc/oip.grpc.pb.cc)
fi
say "compiling ${#sources[@]} C++ files for $TARGET, $jobs at a time"
printf '%s\n' "${flags[@]}" >"$work/flags"
export -f compile_one
export zig work root
printf '%s\n' ${sources[@]+"${sources[@]}"} | xargs -P "$jobs" -I{} bash -c 'compile_one "$1"' _ {} >"$work/results"
bad_files=()
while IFS= read -r f; do bad_files+=("$f"); done < <(sed -n 's/^FAIL //p' "$work/results" | sort)
for f in ${bad_files[@]+"${bad_files[@]}"}; do
  echo "---- $f does not compile for macOS:"
  grep -E '(error|note|warning):|^ ' "$work/logs/${f//\//_}.log" | head -40
done
if ((${#bad_files[@]})); then
  failed+=("compile: ${bad_files[*]+${bad_files[*]}}")
else
  say "all ${#sources[@]} files compile for macOS"
fi

# --- 3. the torch plugin, linked against the macOS torch ---------------------
# Always for the whole tree; for a list of files, when one is the plugin's.
link=$((!$#))
for f in "$@"; do [[ "$f" == runtime/* || "$f" == model/* || "$f" == base/* ]] && link=1; done
if ((link)); then
  plugin_sources=(runtime/aoti_model.cc model/tensor.cc)
  base_sources=()
  while IFS= read -r f; do base_sources+=("base/$f"); done < <(
    sed -n 's/^add_library(aotid_base STATIC \(.*\))$/\1/p' base/CMakeLists.txt | tr ' ' '\n')
  ((${#base_sources[@]})) || die "cannot read aotid_base's sources from base/CMakeLists.txt"
  link_log="$work/logs/plugin-link.log"
  plugin_objs=()
  base_objs=()
  ok=1
  for f in "${plugin_sources[@]}" ${base_sources[@]+"${base_sources[@]}"}; do
    o="$work/obj/$(basename "$f" .cc).o"
    if ! "$zig" c++ "${flags[@]}" -O1 -fPIC -fvisibility=hidden -fvisibility-inlines-hidden -c "$f" -o "$o" \
      >>"$link_log" 2>&1; then
      ok=0
    fi
    if [[ "$f" == base/* ]]; then base_objs+=("$o"); else plugin_objs+=("$o"); fi
  done
  plugin="$work/obj/libaotid_torch.so"
  if ((ok)); then
    # aotid_base as CMake links it: an archive, members taken as needed.
    "$zig" ar rcs "$work/obj/libaotid_base.a" ${base_objs[@]+"${base_objs[@]}"}
    if "$zig" c++ -target "$TARGET" -shared -o "$plugin" ${plugin_objs[@]+"${plugin_objs[@]}"} "$work/obj/libaotid_base.a" \
      -L"$torch/lib" -ltorch -ltorch_cpu -lc10 -Wl,-rpath,@loader_path >>"$link_log" 2>&1; then
      if "$python" - "$plugin" <<'EOF'; then
import struct, sys
# The plugin must export its entry point: read the Mach-O's export trie
# through the symbol table (nlist_64 entries that are external and defined).
data = open(sys.argv[1], "rb").read()
magic, _, _, _, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
assert magic == 0xFEEDFACF, "not a 64-bit Mach-O"
off, names = 32, set()
for _ in range(ncmds):
    cmd, size = struct.unpack_from("<II", data, off)
    if cmd == 0x2:  # LC_SYMTAB
        symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, off + 8)
        for i in range(nsyms):
            strx, ntype, _, _, _ = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
            if ntype & 0x01 and ntype & 0x0E == 0x0E:  # N_EXT, N_SECT
                end = data.index(b"\0", stroff + strx)
                names.add(data[stroff + strx:end].decode())
    off += size
sys.exit(0 if "_aotid_torch_load_v2" in names else "the plugin does not export aotid_torch_load_v2")
EOF
        say "the torch plugin links for macOS arm64 against torch $TORCH_PIN's libtorch, libtorch_cpu and libc10"
      else
        failed+=("plugin exports")
      fi
    else
      ok=0
    fi
  fi
  if ((!ok)); then
    echo "---- the torch plugin does not compile or link for macOS:"
    grep -E 'error|undefined|note: referenced' "$link_log" | head -40
    failed+=("plugin link")
  fi
fi

elapsed=$((SECONDS - started))
if ((${#failed[@]})); then
  say "FAILED (${elapsed} s): ${failed[*]+${failed[*]}}; logs in $work/logs"
  exit 1
fi
say "ok (${elapsed} s)"
