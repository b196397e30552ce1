#!/usr/bin/env bash
# Builds aotid's container image as an OCI image layout, from Debian's
# packages and this checkout alone: no base image is pulled from a hub and no
# container engine runs (docs/IMAGE.md).
#
#   deploy/image/build.sh [--out DIR] [--tag TAG] [--wheel AOTID_WHEEL]
#                         [--python DEV_PYTHON] [--archive FILE.tar]
#
#   --out DIR      the OCI layout to write (replaced); default build-image/oci
#   --tag TAG      its tag; default latest
#   --wheel FILE   the aotid wheel to install; default: built from this
#                  checkout with DEV_PYTHON, as tests/install/wheel_test.sh
#                  builds it (build folder build-wheel; Release, unless
#                  AOTID_WHEEL_BUILD_TYPE and AOTID_WHEEL_CXX name ./dev
#                  build's, RelWithDebInfo and /usr/bin/c++, whose objects
#                  ccache then hands over, as the tests do)
#   --python PY    the Python that builds the wheel and downloads torch and
#                  its dependencies (the dev venv's, with torch 2.13.0);
#                  default $AOTID_PYTHON, else python3 on PATH (the venv's
#                  after eval "$(./dev env)")
#   --archive FILE also write the layout as an oci-archive tar
#
# Three layers, each a plain tar with fixed mtimes, added with umoci:
#   1. Debian bookworm (mmdebstrap, variant apt) with the libraries the aotid
#      binary links (readelf -d), python3 + python3-venv, and g++ for the
#      builds of exported programs; no docs, man pages, locales, apt lists or
#      caches; the user aotid (65532) and its state directory.
#   2. The venv /opt/aotid with torch==2.13.0 (CPU) and its dependencies,
#      taken from this machine's pip (never an unpinned torch).
#   3. The aotid wheel in that venv, /etc/aotid/aotid.toml, and the mount
#      point /mnt/models.
# Layers 1 and 2 are cached under $AOTID_IMAGE_CACHE (default
# ~/.cache/aotid-dev/image), keyed by a hash of what makes them, so that a
# second build redoes layer 3 alone.
#
# Needs root (tar extraction keeps owners; mmdebstrap --mode=root), and
# mmdebstrap, umoci and bubblewrap (./dev installs them on Linux).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/../.." && pwd)"
out="$src/build-image/oci"
tag=latest
wheel=""
python=""
archive=""
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --wheel) wheel="$(realpath "$2")"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --archive) archive="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
say() { printf '[image] %s\n' "$*"; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root: the layers keep their files' owners (uid 65532 for /var/lib/aotid)"
for tool in mmdebstrap umoci bwrap; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install mmdebstrap umoci bubblewrap)"
done
[[ -n $python ]] || python="${AOTID_PYTHON:-$(command -v python3 || true)}"
[[ -x $python ]] || die "no Python to build with: pass --python (the dev venv's)"
"$python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null ||
  die "$python has no torch 2.13.0: pass the dev venv's (--python, or eval \"\$(./dev env)\")"

# Every file in the layers gets this mtime (2026-01-01): the same inputs give
# the same layer tars.
export SOURCE_DATE_EPOCH=1767225600
cache="${AOTID_IMAGE_CACHE:-$HOME/.cache/aotid-dev/image}"
mkdir -p "$cache"
work="$(mktemp -d /tmp/aotid-image.XXXXXX)"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS

# Layer 1: the Debian root filesystem -------------------------------------
suite=bookworm
mirror=http://deb.debian.org/debian
# The mirror apt uses here, when it names one.
if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
  m="$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
  [[ -n $m ]] && mirror="$m"
fi
packages=(
  # What the aotid binary links (readelf -d build/aotid | grep NEEDED).
  libuv1 libsqlite3-0 libzip4 libssl3 libseccomp2 libpcre2-8-0
  libcpp-httplib0.11 libtomlplusplus3
  # The gRPC API: gRPC's C++ library and its core (libgpr), protobuf,
  # abseil (which Debian's gRPC brings; named since aotid links it too).
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623
  # The compile worker and torch (whose wheel brings its own libgomp, but
  # inductor's kernels link the system's: g++ depends on it anyway).
  python3 python3-venv libgomp1
  # AOTInductor compiles an exported program's C++ with it (build.cxx = c++);
  # without it only prebuilt (.so) packages load.
  g++
  # pid 1: reaps the orphans a killed build's compilers leave (the kernel
  # hands them to pid 1, and aotid waits only for its own children) and
  # passes SIGTERM on to aotid, which drains.
  tini
)
# What the image leaves out: docs but the licences, man and info pages,
# translations. mmdebstrap itself removes apt's lists and caches.
dpkg_excludes=(
  'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/locale/*' 'path-exclude=/usr/share/lintian/*'
  # gcc's link-time optimizer and the sanitizers' runtimes (~55 MB): the
  # builds of exported programs use neither (no -flto, no -fsanitize).
  'path-exclude=/usr/lib/gcc/x86_64-linux-gnu/*/lto1'
  'path-exclude=/usr/lib/x86_64-linux-gnu/lib[almt]san.so*'
  'path-exclude=/usr/lib/x86_64-linux-gnu/libhwasan.so*'
  'path-exclude=/usr/lib/x86_64-linux-gnu/libubsan.so*'
)
# The image's user and its state directory (a volume), without useradd.
user_hook='echo "aotid:x:65532:65532:aotid:/var/lib/aotid:/usr/sbin/nologin" >> "$1/etc/passwd";
echo "aotid:x:65532:" >> "$1/etc/group";
echo "aotid:!:20454::::::" >> "$1/etc/shadow";
install -d -m 0750 -o 65532 -g 65532 "$1/var/lib/aotid";
rm -rf "$1"/var/log/* "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/etc/machine-id'
key="$(printf '%s\n' rootfs-v2 merged-usr "$suite" "$mirror" "${packages[@]}" "${dpkg_excludes[@]}" "$user_hook" |
  sha256sum | cut -c1-16)"
rootfs_tar="$cache/rootfs-$key.tar"
if [[ -s $rootfs_tar ]]; then
  say "layer 1: Debian $suite root filesystem from the cache ($rootfs_tar)"
else
  say "layer 1: Debian $suite root filesystem with mmdebstrap from $mirror"
  args=(--mode=root --variant=apt --include="$(IFS=,; echo "${packages[*]}")"
        --aptopt='APT::Install-Recommends "false"' --customize-hook="$user_hook"
        # /usr merged by mmdebstrap itself, not by the usrmerge package (which
        # brings perl, ~50 MB).
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
  for e in "${dpkg_excludes[@]}"; do args+=(--dpkgopt="$e"); done
  mmdebstrap -q "${args[@]}" "$suite" "$work/rootfs.tar" "$mirror" >"$work/mmdebstrap.log" 2>&1 ||
    { cat "$work/mmdebstrap.log"; die "mmdebstrap failed"; }
  mv "$work/rootfs.tar" "$rootfs_tar"
fi

# Layer 3's wheel, built first: the venv layer's key does not depend on it,
# but a checkout that does not build should fail before the slow steps.
if [[ -z $wheel ]]; then
  say "building the aotid wheel from $src"
  wheel="$("$src/scripts/build_wheel.sh" "$src" "$python" "$work/dist")" || die "the wheel did not build"
fi
[[ -f $wheel ]] || die "no wheel at $wheel"
say "wheel: $(basename "$wheel")"

# Layer 2: torch and the wheel's other dependencies in /opt/aotid -----------
# torch==2.13.0 from this machine's pip (a local wheel: nothing large is
# downloaded), then what the aotid wheel asks for besides, pinned to what
# that resolves to.
mkdir -p "$work/wheels"
{ "$python" -m pip download -q --disable-pip-version-check --no-deps -d "$work/wheels" torch==2.13.0 &&
  "$python" -m pip download -q --disable-pip-version-check -d "$work/wheels" --find-links "$work/wheels" \
    "$wheel"; } >"$work/download.log" 2>&1 || { cat "$work/download.log"; die "pip download failed"; }
rm -f "$work"/wheels/aotid-*.whl
torch_whl="$(ls "$work"/wheels/torch-*.whl)"
[[ $(basename "$torch_whl") == torch-2.13.0+cpu-cp311-* ]] ||
  die "pip found $(basename "$torch_whl"), not torch 2.13.0+cpu for Python 3.11"
if ls "$work"/wheels | grep -q '^nvidia'; then die "a CUDA dependency came with torch: $(ls "$work"/wheels)"; fi
venv_key="$( (echo venv-v1; echo "$key"; cd "$work/wheels" && sha256sum -- *.whl) | sha256sum | cut -c1-16)"
venv_tar="$cache/venv-$venv_key.tar"

# The tree layers 2 and 3 are made in: layer 1, but for what installing
# wheels does not use (the compiler, ~200 MB less to write and delete).
root="$work/root"
mkdir -p "$root"
tar -C "$root" --numeric-owner -xpf "$rootfs_tar" --exclude=usr/lib/gcc --exclude=usr/include \
  --exclude=usr/libexec/gcc
inside() { # runs a command in $root, the wheels at /wheels, no network
  bwrap --bind "$root" / --ro-bind "$work/wheels" /wheels --proc /proc --dev /dev --tmpfs /tmp \
    --unshare-all --die-with-parent --setenv PATH /usr/bin:/bin --setenv HOME /root --chdir / -- "$@"
}
# A layer tar of the files in $root changed since a marker, with the
# directories above them, sorted, owners numeric, mtimes fixed.
layer_tar() { # MARKER OUT PATH...
  local marker="$1" tarfile="$2"; shift 2
  (cd "$root" && find "$@" -cnewer "$marker" -print0 | sort -z) > "$work/list"
  tar -C "$root" --null --no-recursion -T "$work/list" --numeric-owner --mtime=@$SOURCE_DATE_EPOCH \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$tarfile"
}
if [[ -s $venv_tar ]]; then
  say "layer 2: torch venv from the cache ($venv_tar)"
else
  say "layer 2: /opt/aotid venv with $(basename "$torch_whl") and $(($(ls "$work/wheels" | wc -l) - 1)) more"
  touch "$work/marker2"; sleep 1
  inside /usr/bin/python3 -m venv /opt/aotid
  inside /bin/sh -c '/opt/aotid/bin/pip install -q --disable-pip-version-check --no-cache-dir --no-index \
    --find-links /wheels /wheels/*.whl'
  layer_tar "$work/marker2" "$work/venv.tar" opt
  mv "$work/venv.tar" "$venv_tar"
fi
if [[ ! -d $root/opt/aotid ]]; then
  # The venv from the cache, but for the large packages a --no-deps install
  # of the aotid wheel does not read.
  site=opt/aotid/lib/python3.11/site-packages
  tar -C "$root" --numeric-owner -xpf "$venv_tar" --exclude="$site/torch" --exclude="$site/sympy" \
    --exclude="$site/numpy" --exclude="$site/numpy.libs" --exclude="$site/networkx" --exclude="$site/functorch" \
    --exclude="$site/torchgen"
fi

# Layer 3: aotid and its configuration ------------------------------------
say "layer 3: $(basename "$wheel") and /etc/aotid/aotid.toml"
touch "$work/marker3"; sleep 1
cp "$wheel" "$work/wheels/"
inside /opt/aotid/bin/pip install -q --disable-pip-version-check --no-cache-dir --no-index --no-deps \
  "/wheels/$(basename "$wheel")"
install -d -m 0755 "$root/etc/aotid"
# Where KServe (and the docs' examples) mount a model read-only: a read-only
# root filesystem needs the mount point to exist.
install -d -m 0755 "$root/mnt/models"
cat > "$root/etc/aotid/aotid.toml" <<'TOML'
# aotid in its container image (deploy/image/build.sh); every other key keeps
# its default (aotid config shows them). Command-line flags override these.
[store]
# The image's volume, owned by the user aotid (65532).
path = "/var/lib/aotid"

[server]
# Every address of the container's network namespace: a loopback address
# would not be reachable through a published port.
listen = "0.0.0.0:8080"
TOML
chmod 0644 "$root/etc/aotid/aotid.toml"
# The venv's python3 links to /usr/bin/python3; aotid finds it beside itself.
[[ -x $root/opt/aotid/bin/aotid ]] || die "the wheel put no aotid at /opt/aotid/bin/aotid"
# Every library the binary links is in the image: one that layer 1's list
# lacks fails here, by name, rather than at the container's first start.
missing="$(inside /usr/bin/ldd /opt/aotid/bin/aotid | awk '/not found/ {print $1}' | tr '\n' ' ')"
[[ -z $missing ]] || die "the image lacks libraries aotid links: $missing(add their packages to layer 1's list)"
layer_tar "$work/marker3" "$work/app.tar" opt etc/aotid mnt

# The OCI layout ---------------------------------------------------------
say "writing the OCI layout at $out"
rm -rf "$out"
mkdir -p "$(dirname "$out")"
created="$(date -u -d @$SOURCE_DATE_EPOCH +%Y-%m-%dT%H:%M:%SZ)"
img="$out:$tag"
umoci init --layout "$out"
umoci new --image "$img"
umoci raw add-layer --image "$img" --history.created "$created" \
  --history.created_by "mmdebstrap $suite: ${packages[*]}" "$rootfs_tar"
umoci raw add-layer --image "$img" --history.created "$created" \
  --history.created_by "venv /opt/aotid: $(cd "$work/wheels" && ls ./*.whl | grep -v aotid- | tr '\n' ' ')" "$venv_tar"
umoci raw add-layer --image "$img" --history.created "$created" \
  --history.created_by "pip install $(basename "$wheel"); /etc/aotid/aotid.toml" "$work/app.tar"
umoci config --image "$img" --created "$created" --history.created "$created" \
  --author "aotid deploy/image/build.sh" \
  --config.user 65532:65532 \
  --config.entrypoint /usr/bin/tini --config.entrypoint -- --config.entrypoint /opt/aotid/bin/aotid \
  --config.cmd serve \
  --config.env PATH=/opt/aotid/bin:/usr/local/bin:/usr/bin:/bin \
  --config.env AOTID_CONFIG=/etc/aotid/aotid.toml \
  --config.env LANG=C.UTF-8 \
  --config.workingdir /var/lib/aotid \
  --config.volume /var/lib/aotid \
  --config.exposedports 8080/tcp \
  --config.stopsignal SIGTERM \
  --config.label org.opencontainers.image.title=aotid \
  --config.label org.opencontainers.image.description="Serves PyTorch AOTInductor models over HTTP" \
  --config.label org.opencontainers.image.version="$(basename "$wheel" | cut -d- -f2)" \
  --config.label org.opencontainers.image.base.name="debian:$suite (mmdebstrap)"
umoci gc --layout "$out"

if [[ -n $archive ]]; then
  (cd "$out" && find . -print0 | sort -z |
     tar --null --no-recursion -T - --numeric-owner --owner=0 --group=0 --mtime=@$SOURCE_DATE_EPOCH \
       -cf "$(realpath -m "$archive")")
  say "oci-archive: $archive"
fi

# What it weighs: the layers as a registry stores them (gzip) and unpacked.
python3 - "$out" "$tag" "$rootfs_tar" "$venv_tar" "$work/app.tar" <<'PY'
import json, os, sys, tarfile
out, tag, *tars = sys.argv[1:]
index = json.load(open(os.path.join(out, "index.json")))
desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
blob = lambda d: os.path.join(out, "blobs", *d["digest"].split(":"))
manifest = json.load(open(blob(desc)))
gz = [layer["size"] for layer in manifest["layers"]]
raw = [os.path.getsize(t) for t in tars]
mib = lambda n: f"{n / 2**20:.1f} MiB"
for name, g, r in zip(["debian", "torch venv", "aotid"], gz, raw):
    print(f"[image] layer {name}: {mib(g)} compressed, {mib(r)} as tar")
# Unpacked: the bytes of the files the layers hold (no layer replaces
# another's files).
unpacked = 0
for t in tars:
    with tarfile.open(t) as f:
        unpacked += sum(m.size for m in f if m.isreg())
print(f"[image] size: {sum(gz)} bytes compressed ({mib(sum(gz))}), {unpacked} bytes unpacked ({mib(unpacked)})")
PY
say "built $img in $((SECONDS - t0)) s"
