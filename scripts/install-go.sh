#!/usr/bin/env bash
# Find a Go toolchain that can build versitygw (scripts/install-versitygw.sh), or
# install one, and print the path of its `go` binary on stdout.
#
#   scripts/install-go.sh            # -> /usr/local/go/bin/go, or <repo>/.tools/go/bin/go
#
# Any Go >= 1.21 will do: it fetches the newer toolchain versitygw's go.mod asks for
# through the Go module proxy by itself (install-versitygw.sh sets GOTOOLCHAIN=auto).
# Looked for: $GO, `go` on PATH, /usr/local/go/bin/go, <tools>/go/bin/go.
#
# If there is none, Go $GO_VERSION is installed into <tools>/go (<repo>/.tools, or
# LSVD_TOOLS_DIR): Debian's golang-go (Go 1.19, too old for versitygw itself) is
# installed with apt-get as a bootstrap if no Go at all is there, and downloads the
# official toolchain module golang.org/toolchain@v0.0.1-go$GO_VERSION.<os>-<arch>
# through the Go module proxy (checked against the checksum database), exactly what
# GOTOOLCHAIN does in newer releases. `--force` installs into <tools>/go even if a
# usable Go exists (GO_BOOTSTRAP=PATH picks the Go that downloads it).
# Progress goes to stderr.
set -euo pipefail

GO_VERSION="1.25.0" # versitygw v1.8.0's go.mod says `go 1.25.0`

# shellcheck source=lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"
goroot="$tools/go"
force=""
if [[ "${1:-}" == "--force" ]]; then
    force=1
fi

# "1.26.8" from "go version go1.26.8 linux/amd64"; empty if it does not run.
go_version_of() {
    GOTOOLCHAIN=local "$1" version 2>/dev/null | sed -n 's/^go version go\([0-9][0-9.]*\).*/\1/p'
}

# Is version $1 at least 1.21 (the first release that switches toolchains itself)?
at_least_1_21() {
    local major minor
    IFS=. read -r major minor _ <<<"$1"
    [[ -n "$major" && -n "$minor" ]] && ((major > 1 || (major == 1 && minor >= 21)))
}

candidates=()
[[ -n "${GO:-}" ]] && candidates+=("$GO")
command -v go >/dev/null 2>&1 && candidates+=("$(command -v go)")
candidates+=(/usr/local/go/bin/go "$goroot/bin/go")

if [[ -z "$force" ]]; then
    for g in "${candidates[@]}"; do
        [[ -x "$g" ]] || continue
        v="$(go_version_of "$g")"
        if [[ -n "$v" ]] && at_least_1_21 "$v"; then
            echo "$g"
            exit 0
        fi
    done
fi

# Nothing usable: install Go $GO_VERSION into $goroot.
case "$(uname -m)" in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *)
        echo "install-go: no Go >= 1.21 and no prebuilt toolchain for $(uname -m)" >&2
        exit 1
        ;;
esac
os="$(uname -s | tr '[:upper:]' '[:lower:]')"
module="golang.org/toolchain@v0.0.1-go$GO_VERSION.$os-$arch"

bootstrap="${GO_BOOTSTRAP:-}"
if [[ -z "$bootstrap" ]]; then
    for g in "${candidates[@]}" /usr/lib/go/bin/go; do
        if [[ -x "$g" && -n "$(go_version_of "$g")" ]]; then
            bootstrap="$g"
            break
        fi
    done
fi
if [[ -z "$bootstrap" ]]; then
    echo "install-go: no Go at all; installing Debian's golang-go to bootstrap Go $GO_VERSION" >&2
    apt_install install-go golang-go ca-certificates
    bootstrap=/usr/lib/go/bin/go
    [[ -x "$bootstrap" ]] || bootstrap="$(command -v go)"
fi

echo "install-go: fetching $module with $bootstrap ($(go_version_of "$bootstrap"))" >&2
work="$(mktemp -d "${TMPDIR:-/tmp}/lsvd-go-bootstrap.XXXXXX")"
trap 'chmod -R u+w "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/mod"
printf 'module bootstrap\n\ngo 1.19\n' >"$work/mod/go.mod"
(
    cd "$work/mod"
    GOTOOLCHAIN=local GOFLAGS=-modcacherw GOMODCACHE="$work/cache" GOPATH="$work/gopath" \
        "$bootstrap" mod download "$module" >&2
)
src="$work/cache/$module"
if [[ ! -x "$src/bin/go" && ! -f "$src/bin/go" ]]; then
    echo "install-go: $module has no bin/go" >&2
    exit 1
fi
rm -rf "$goroot.new"
mkdir -p "$tools"
cp -r "$src" "$goroot.new"
chmod -R u+w "$goroot.new"
# Module zips carry no file modes: make the tools executable again (as `go` itself
# does when GOTOOLCHAIN downloads a toolchain).
chmod +x "$goroot.new"/bin/* "$goroot.new"/pkg/tool/*/*
if [[ "$(go_version_of "$goroot.new/bin/go")" != "$GO_VERSION" ]]; then
    echo "install-go: the downloaded toolchain does not run" >&2
    exit 1
fi
rm -rf "$goroot"
mv "$goroot.new" "$goroot"
echo "install-go: installed Go $GO_VERSION in $goroot" >&2
echo "$goroot/bin/go"
