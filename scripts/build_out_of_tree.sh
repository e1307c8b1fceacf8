# Sourced by scripts/sanitize.sh and scripts/torch_leg.sh: build torch_shard's two libraries outside the
# source tree and make a package tree that imports them.
#
#   build_out_of_tree PY OUT [extra environment for setup.py, e.g. TORCH_SHARD_SANITIZE=1]
#
# Objects and libraries go to OUT/temp and OUT/lib; OUT/pkg/torch_shard holds the Python sources
# (linked, so edits show) and the new libraries. Run from the source tree's root; put OUT/pkg first on
# PYTHONPATH and run from another folder (the current directory comes first on sys.path, and the
# source tree's own torch_shard holds the main build's libraries).
build_out_of_tree() {
  local py=$1 out=$2 entry pkg
  shift 2
  env "$@" MAX_JOBS="${MAX_JOBS:-2}" "$py" setup.py -q build_ext --build-temp "$out/temp" --build-lib "$out/lib"
  pkg="$out/pkg/torch_shard"
  rm -rf "$out/pkg"
  mkdir -p "$pkg"
  for entry in torch_shard/*; do
    case "$entry" in
      *.so) ;;
      *) ln -s "$PWD/$entry" "$pkg/$(basename "$entry")" ;;
    esac
  done
  cp "$out"/lib/torch_shard/_C*.so "$out"/lib/torch_shard/_testing_C*.so "$pkg/"
}
