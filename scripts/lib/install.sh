# Sourced by scripts/install-azurite.sh, install-go.sh, install-fake-gcs.sh and
# install-versitygw.sh: the steps every tool installer takes, written once. Sets
# $repo (the checkout) and $tools (<repo>/.tools, or LSVD_TOOLS_DIR) when sourced.
#
#   print_if_installed BIN STAMP          if BIN runs and STAMP (the pinned version's
#                                         marker) exists, print BIN and exit 0
#   apt_install WHO PACKAGE...            apt-get update and install the packages, with
#                                         sudo when not root (exit 1 if there is none)
#   go_install_tool WHO NAME VERSION MODULE NOTE
#                                         build MODULE@VERSION with scripts/install-go.sh's
#                                         Go into <tools>/bin/NAME, unless that version is
#                                         there, and print its path (NOTE: how long it takes)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="${LSVD_TOOLS_DIR:-$repo/.tools}"

print_if_installed() {
    if [[ -x "$1" && -f "$2" ]]; then
        echo "$1"
        exit 0
    fi
}

apt_install() {
    local who="$1" sudo=()
    shift
    if [[ "$(id -u)" -ne 0 ]]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "$who: need root to apt-get install $*" >&2
            exit 1
        fi
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq >&2
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2
}

go_install_tool() {
    local who="$1" name="$2" version="$3" module="$4" note="$5"
    local bin_dir="$tools/bin"
    local bin="$bin_dir/$name" stamp="$bin_dir/.$name-$version"
    print_if_installed "$bin" "$stamp"
    local go
    go="$("$repo/scripts/install-go.sh")"
    mkdir -p "$bin_dir"
    echo "$who: building $name $version with $go ($note)" >&2
    rm -f "$bin_dir/.$name-"*
    # GOTOOLCHAIN=auto: a Go older than the tool's go.mod asks for fetches that
    # toolchain through the module proxy (some installations default to `local`).
    GOTOOLCHAIN=auto GOBIN="$bin_dir" GOFLAGS="${GOFLAGS:-} -trimpath" \
        "$go" install "$module@$version" >&2
    if [[ ! -x "$bin" ]]; then
        echo "$who: go install finished but $bin is missing" >&2
        exit 1
    fi
    touch "$stamp"
    echo "$bin"
}
