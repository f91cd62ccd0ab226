#!/usr/bin/env bash
# Builds the operator image from the Dockerfile, or reuses a cached build of the same sources.
# Usage: hack/image.sh [build|key|tools|example DOCKERFILE CONTEXT NAME]   (default: build)
#   build  writes dist/tputorch-operator.oci.tar (OCI archive), dist/tputorch-operator.docker.tar
#          (for `docker load` / `kind load image-archive`) and dist/image.json (name, tag, layers)
#   key    print the cache key: a hash of the Dockerfile, .dockerignore, pyproject.toml, operator/,
#          this script and the base image
#   tools  install what building and the image tests need (buildah, umoci) from Debian's packages
#   example  build an example image (examples/Dockerfile, examples/serve/Dockerfile, ...) with buildah
#          from the stand-in of Ray's image (hack/ray-base.Containerfile), the RUN steps that only
#          download what cannot be fetched here skipped (hack/standin_dockerfile.py), or reuse the
#          cached build of the same inputs; writes dist/NAME.oci.tar and dist/NAME.json
# Environment:
#   BASE_IMAGE   base image (the Dockerfile's PYTHON_IMAGE), e.g.
#                docker.io/library/python:3.11.11-slim-bookworm. Unset: with docker the Dockerfile's
#                default; with buildah the local stand-in built by hack/base-image.sh (no registry here)
#   BUILDER      docker | buildah (default: docker when a daemon answers, else buildah)
#   CA_BUNDLE    CA bundle pip needs to reach the package index, passed as a build secret (never in
#                the image). Default: $PIP_CERT, else the system bundle when the host has extra CAs
#                in /usr/local/share/ca-certificates, else none
#   TPUTORCH_CACHE  cache root (default ~/.cache/tputorch); archives go to $TPUTORCH_CACHE/image/
# Container storage (buildah) stays inside the project: .cache/containers/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${TPUTORCH_CACHE:-$HOME/.cache/tputorch}/image
STORE=$REPO/.cache/containers
DIST=$REPO/dist
NAME=tputorch-operator
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/operator/tputorch/__init__.py")

log() { echo "[image $(date +%H:%M:%S)] $*" >&2; }

apt_install() {  # apt_install <command> <package>: install the package when the command is missing
  command -v "$1" >/dev/null && return 0
  log "installing $2 from Debian's packages"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2"; } >&2
}

if [[ -z ${BUILDER:-} ]]; then
  if command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then BUILDER=docker; else BUILDER=buildah; fi
fi
case $BUILDER in docker|buildah) ;; *) echo "BUILDER=$BUILDER: must be docker or buildah" >&2; exit 2 ;; esac
builder() { echo "$BUILDER"; }

# The stand-in base: its key covers the script that makes it.
BASE_KEY=$(sha256sum "$REPO/hack/base-image.sh" | cut -c1-16)
BASE_STANDIN=localhost/tputorch-base:bookworm-py3.11-$BASE_KEY

base_ref() {
  if [[ -n ${BASE_IMAGE:-} ]]; then echo "$BASE_IMAGE"
  elif [[ $(builder) == buildah ]]; then echo "$BASE_STANDIN"
  else echo default; fi
}

cache_key() {
  (
    cd "$REPO"
    sha256sum Dockerfile .dockerignore pyproject.toml requirements.lock hack/image.sh
    # the same files the build context takes from operator/ (.dockerignore drops caches)
    find operator -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    echo "base $(base_ref) builder $(builder)"
  ) | sha256sum | cut -c1-16
}

ca_bundle() {
  local ca=${CA_BUNDLE:-${PIP_CERT:-}}
  if [[ -z $ca ]] && compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    ca=/etc/ssl/certs/ca-certificates.crt
  fi
  echo "$ca"
}

# buildah, with its storage and run root in the project. The few global paths it writes to anyway
# (the image copier's blob-info cache, the network config dir) are bind mounts of project folders in
# a mount namespace of its own, so nothing of it stays outside the project but two empty mount points.
bah() {
  mkdir -p "$STORE/varlib" "$STORE/networks" /var/lib/containers /etc/containers/networks
  unshare --mount --propagation private -- sh -c 'set -e; s=$1; shift
    mount --bind "$s/varlib" /var/lib/containers
    mount --bind "$s/networks" /etc/containers/networks
    exec buildah --root "$s/storage" --runroot "$s/run" --storage-driver vfs "$@"' sh "$STORE" "$@"
}

tools() {
  apt_install umoci umoci
  [[ $(builder) == docker ]] && { apt_install skopeo skopeo; return 0; }
  apt_install buildah buildah
  [[ -z ${BASE_IMAGE:-} ]] && apt_install mmdebstrap mmdebstrap
  return 0
}

# The stand-in base in the project's storage: from the cached archive, else built (and cached).
ensure_standin_base() {
  bah inspect --type image "$BASE_STANDIN" >/dev/null 2>&1 && return 0
  local archive=$CACHE/base-$BASE_KEY.oci.tar
  if [[ ! -s $archive ]]; then
    local t0=$SECONDS tmp
    log "building the stand-in base $BASE_STANDIN with mmdebstrap"
    tmp=$(mktemp -d "$STORE/tmp/base.XXXXXX")
    "$REPO/hack/base-image.sh" "$tmp/rootfs.tar" >&2
    local ctr
    ctr=$(bah from --quiet scratch)
    bah add --quiet "$ctr" "$tmp/rootfs.tar" / >/dev/null
    # What python:3.11-slim-bookworm sets that the Dockerfile relies on.
    bah config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env LANG=C.UTF-8 --cmd python3 --os linux --arch amd64 "$ctr"
    bah commit --quiet --rm "$ctr" "$BASE_STANDIN" >/dev/null
    bah push --quiet "$BASE_STANDIN" "oci-archive:$archive.tmp" && mv "$archive.tmp" "$archive"
    rm -rf "$tmp"
    log "stand-in base built and cached in $((SECONDS - t0))s: $archive"
  else
    log "loading the cached stand-in base $archive"
    bah tag "$(bah pull --quiet "oci-archive:$archive")" "$BASE_STANDIN"
  fi
}

diff_ids() {  # the base's layer digests, as JSON
  if [[ $(builder) == docker ]]; then docker image inspect --format '{{json .RootFS.Layers}}' "$1"
  else bah inspect --type image "$1" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["OCIv1"]["rootfs"]["diff_ids"]))'; fi
}

build_into() {  # build_into <dir> <tag>: the archives and image.json, written into <dir>
  local out=$1 tag=$2 base ca secret
  base=$(base_ref)
  ca=$(ca_bundle)
  secret=$out/ca.secret   # empty when the host needs no extra CA (the Dockerfile then uses pip's own)
  trap "rm -f '$secret'" EXIT   # also when the build fails
  if [[ -n $ca ]]; then cp "$ca" "$secret"; else : >"$secret"; fi
  local args=(--secret "id=pip-ca,src=$secret" -f "$REPO/Dockerfile")
  [[ $base != default ]] && args+=(--build-arg "PYTHON_IMAGE=$base")
  local t0=$SECONDS
  if [[ $(builder) == docker ]]; then
    [[ $base == default ]] && base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$REPO/Dockerfile")
    DOCKER_BUILDKIT=1 docker build "${args[@]}" -t "$NAME:$tag" "$REPO" >&2
    docker save -o "$out/$NAME.docker.tar" "$NAME:$tag"
    skopeo copy --quiet "docker-archive:$out/$NAME.docker.tar" "oci-archive:$out/$NAME.oci.tar:$tag"
  else
    [[ $base == "$BASE_STANDIN" ]] && ensure_standin_base
    # named as docker names it, so the docker archive holds that one name (not also localhost/...)
    local ref=docker.io/library/$NAME:$tag
    bah build --quiet --isolation chroot --layers=false "${args[@]}" -t "$ref" "$REPO" >&2
    bah push --quiet "$ref" "oci-archive:$out/$NAME.oci.tar:$tag"
    bah push --quiet "$ref" "docker-archive:$out/$NAME.docker.tar:$ref"
  fi
  local secs=$((SECONDS - t0)) ids
  rm -f "$secret"
  ids=$(diff_ids "$base")
  python3 - "$out/image.json" "$NAME" "$tag" "$base" "$ids" "$(builder)" "$ca" "$secs" <<'EOF'
import json, sys
path, name, tag, base, ids, builder, ca, secs = sys.argv[1:]
json.dump({"name": f"{name}:{tag}", "repository": name, "tag": tag, "base": base,
           "base_diff_ids": json.loads(ids), "builder": builder, "ca_bundle": ca,
           "build_seconds": int(secs)}, open(path, "w"), indent=1)
EOF
  log "built $NAME:$tag with $(builder) in ${secs}s"
}

build() {
  tools
  local key tag
  key=$(cache_key)
  tag=$VERSION-$key
  local hit=$CACHE/$key
  mkdir -p "$CACHE" "$DIST" "$STORE/tmp"
  export TMPDIR=$STORE/tmp   # buildah's scratch space stays in the project too
  exec 9>"$CACHE/lock"
  flock 9   # one build per cache at a time; a second caller then finds the result
  if [[ ! -s $hit/image.json ]]; then
    rm -rf "$hit.tmp" && mkdir -p "$hit.tmp"
    build_into "$hit.tmp" "$tag"
    rm -rf "$hit" && mv "$hit.tmp" "$hit"
    # Keep the newest few builds (other clones and branches of this machine share the cache).
    find "$CACHE" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{16}' -printf '%T@ %p\n' \
      | sort -rn | tail -n +5 | cut -d' ' -f2- | xargs -r rm -rf
    # Older builds of the operator image in this project's storage are no longer needed.
    if [[ $(builder) == buildah ]]; then
      for old in $(bah images --format '{{.Name}}:{{.Tag}}' | grep "/$NAME:" | grep -v ":$tag\$"); do
        bah rmi "$old" >/dev/null || true
      done
    fi
  else
    log "cached: $hit"
  fi
  for f in "$NAME.oci.tar" "$NAME.docker.tar" image.json; do cp --reflink=auto "$hit/$f" "$DIST/$f.tmp" && mv "$DIST/$f.tmp" "$DIST/$f"; done
  log "$DIST/$NAME.oci.tar ($(du -h "$DIST/$NAME.oci.tar" | cut -f1)), $DIST/$NAME.docker.tar ($(du -h "$DIST/$NAME.docker.tar" | cut -f1)): $NAME:$tag"
}

# The stand-in of Ray's image: hack/ray-base.Containerfile on the stand-in base. Its name (in the
# example images' cache keys) is known without the image; the image is loaded only for a build.
ray_base_name() {
  RAY_KEY=$( (echo "$BASE_KEY"; cat "$REPO/hack/ray-base.Containerfile") | sha256sum | cut -c1-16)
  RAY_STANDIN=localhost/tputorch-ray-base:py3.11-$RAY_KEY
}
ensure_ray_base() {
  ray_base_name
  bah inspect --type image "$RAY_STANDIN" >/dev/null 2>&1 && return 0
  local archive=$CACHE/ray-base-$RAY_KEY.oci.tar
  if [[ -s $archive ]]; then
    log "loading the cached stand-in of Ray's image $archive"
    bah tag "$(bah pull --quiet "oci-archive:$archive")" "$RAY_STANDIN"
    return 0
  fi
  ensure_standin_base
  local t0=$SECONDS
  bah build --quiet --isolation chroot --layers=false --build-arg "BASE=$BASE_STANDIN" \
    -f "$REPO/hack/ray-base.Containerfile" -t "$RAY_STANDIN" "$REPO/hack" >&2
  bah push --quiet "$RAY_STANDIN" "oci-archive:$archive.tmp" && mv "$archive.tmp" "$archive"
  log "stand-in of Ray's image built and cached in $((SECONDS - t0))s: $archive"
}

example() {  # example <Dockerfile> <context> <name>
  local dockerfile=$1 context=$2 name=$3
  [[ $(builder) == buildah ]] || { echo "example images: buildah only (BUILDER=buildah)" >&2; exit 2; }
  tools
  mkdir -p "$CACHE" "$DIST" "$STORE/tmp"
  export TMPDIR=$STORE/tmp
  exec 9>"$CACHE/lock"
  flock 9
  ray_base_name
  local tmp summary key hit
  tmp=$(mktemp -d "$STORE/tmp/example.XXXXXX")
  trap "rm -rf '$tmp'" EXIT
  summary=$(python3 "$REPO/hack/standin_dockerfile.py" "$dockerfile" "$context" "$RAY_STANDIN" "$tmp/Dockerfile")
  key=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["key"])' "$summary")
  hit=$CACHE/example-$name-$key
  if [[ ! -s $hit/image.json ]]; then
    ensure_ray_base
    local ca t0=$SECONDS args=(--quiet --isolation chroot --layers=false -f "$tmp/Dockerfile")
    ca=$(ca_bundle)
    # pip in the RUN steps that reach PyPI needs the build host's CA: a site pip.conf naming it,
    # both mounted for the build only (never in a layer)
    if [[ -n $ca ]]; then
      printf '[global]\ncert = /run/host-ca.pem\n' >"$tmp/pip.conf"
      args+=(--volume "$ca:/run/host-ca.pem:ro" --volume "$tmp/pip.conf:/etc/pip.conf:ro")
    fi
    rm -rf "$hit.tmp" && mkdir -p "$hit.tmp"
    bah build "${args[@]}" -t "localhost/$name:$key" "$context" >&2
    bah push --quiet "localhost/$name:$key" "oci-archive:$hit.tmp/$name.oci.tar:$key"
    bah rmi "localhost/$name:$key" >/dev/null
    python3 - "$hit.tmp/image.json" "$name" "$key" "$summary" "$RAY_STANDIN" "$((SECONDS - t0))" "$dockerfile" <<'EOF'
import json, sys
path, name, tag, summary, standin, secs, dockerfile = sys.argv[1:]
s = json.loads(summary)
json.dump({"name": f"{name}:{tag}", "tag": tag, "dockerfile": dockerfile, "bases": s["bases"],
           "stand_in": standin, "skipped": s["skipped"], "build_seconds": int(secs)}, open(path, "w"), indent=1)
EOF
    rm -rf "$hit" && mv "$hit.tmp" "$hit"
    log "built $name:$key in $((SECONDS - t0))s"
    # Keep the newest two builds of each example (branches of this machine share the cache).
    find "$CACHE" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex ".*/example-$name-[0-9a-f]{16}" -printf '%T@ %p\n' \
      | sort -rn | tail -n +3 | cut -d' ' -f2- | xargs -r rm -rf
  else
    log "cached: $hit"
  fi
  cp --reflink=auto "$hit/$name.oci.tar" "$DIST/$name.oci.tar.tmp" && mv "$DIST/$name.oci.tar.tmp" "$DIST/$name.oci.tar"
  # The record's Dockerfile facts (its bases, the downloads the stand-in skips) are this Dockerfile's,
  # not the cached build's: Dockerfiles that differ only in skipped steps share one stand-in build.
  python3 - "$hit/image.json" "$summary" "$dockerfile" "$DIST/$name.json" <<'EOF'
import json, sys
cached, summary, dockerfile, out = sys.argv[1:]
record, s = json.load(open(cached)), json.loads(summary)
record.update(dockerfile=dockerfile, bases=s["bases"], skipped=s["skipped"])
json.dump(record, open(out, "w"), indent=1)
EOF
}

case ${1:-build} in
  build) build ;;
  example) [[ $# == 4 ]] || { echo "usage: $0 example DOCKERFILE CONTEXT NAME" >&2; exit 2; }; example "$2" "$3" "$4" ;;
  key) cache_key ;;
  tools) tools ;;
  *) echo "usage: $0 [build|key|tools|example DOCKERFILE CONTEXT NAME]" >&2; exit 2 ;;
esac
