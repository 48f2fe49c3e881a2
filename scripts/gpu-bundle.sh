#!/usr/bin/env bash
# Packs what trainer needs to build and test on a GPU machine that has CUDA, CMake, ninja, a
# compiler and a CUDA PyTorch, and nothing else: no network, none of Debian's -dev packages.
# Run it here (it downloads from Debian's archive); carry the folder it writes to the GPU
# machine with the repository.
#
#   scripts/gpu-bundle.sh [OUT_DIR]        (default: .gpu-bundle, git-ignored)
#
# What goes in: the packages scripts/deps.list marks `bundle`, as Debian ships them, and every
# shared library their libraries and programs need at run time beyond glibc, libstdc++ and
# libgcc (found from each ELF file's DT_NEEDED entries, until none is missing). Left out:
# documentation, static libraries that have a shared one beside them, of Boost's headers all
# but the libraries trainer includes (with everything they include, kept whole), Gloo's
# library (c10d includes its headers; PyTorch links Gloo itself) and GoogleTest's sources.
# Fashion-MNIST's IDX files are carried uncompressed (xz packs them 15% smaller than gzip).
# OUT_DIR gets trainer-gpu-bundle.tar.xz (a prefix with usr/ at its root, for CMAKE_PREFIX_PATH)
# and MANIFEST (each package and version, the libraries added for run time, the sizes). Fails
# when the archive is over 40 MB, or a symbolic link in it leads nowhere.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/.gpu-bundle}")
limit_bytes=$((40 * 1000 * 1000))
arch_lib=usr/lib/x86_64-linux-gnu

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/prefix
mkdir -p "$stage" "$work/debs" "$out"

# Boost's libraries that trainer's sources include, with what they include in turn (measured
# from a build's dependency files: 699 headers under these folders and boost/*.hpp).
boost_kept=(assert bind concept config container container_hash core detail dll exception function iterator
  lexical_cast math move mpl numeric predef preprocessor program_options range smart_ptr type_index
  type_traits utility)

# Sonames every Linux with a C++ compiler has: never carried.
base_sonames='^(libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|ld-linux-x86-64\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'

declare -A have=()
fetch() {  # fetch PACKAGE...: downloads and unpacks each package not unpacked yet
  local p
  for p in "$@"; do
    [ -n "${have[$p]:-}" ] && continue
    have[$p]=1
    (cd "$work/debs" && apt-get download -q=2 -o APT::Sandbox::User=root "$p") || {
      echo "gpu-bundle: cannot download $p (run apt-get update first?)" >&2
      exit 2
    }
    dpkg-deb -x "$work/debs/${p}"_*.deb "$stage"
  done
}

mapfile -t listed < <(awk '!/^#/ && $2 == "bundle" { print $1 }' "$root/scripts/deps.list")
fetch "${listed[@]}"
# Of Gloo, c10d includes the headers (PyTorch links Gloo itself); of GoogleTest, the
# libraries and headers (its sources under usr/src are for building it).
rm -f "$stage/usr/lib/libgloo.so"
rm -rf "$stage/usr/src"

# Run-time closure: a soname that an ELF file in the bundle needs, or a file a symbolic link
# leads to, that neither the bundle nor the base system provides comes from the package that
# provides it here.
added=()
while true; do
  missing=()
  while IFS= read -r -d '' f; do
    readelf -h "$f" >/dev/null 2>&1 || continue  # ELF files only
    while read -r soname; do
      [[ $soname =~ $base_sonames ]] && continue
      [ -n "$(find "$stage" -name "$soname" -print -quit)" ] && continue
      missing+=("$soname")
    done < <(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  done < <(find "$stage" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0)
  # A development package's libfoo.so links to the library its run-time package holds.
  while IFS= read -r -d '' l; do
    target=$(readlink -m "$l")
    missing+=("/${target#"$stage"/}")
  done < <(find "$stage" -xtype l -print0)
  [ ${#missing[@]} -eq 0 ] && break
  new=()
  for need in $(printf '%s\n' "${missing[@]}" | sort -u); do
    case $need in
      /*) pkg=$( (dpkg -S "$need" 2>/dev/null || true) | head -1 | cut -d: -f1) ;;
      *) pkg=$( (dpkg -S "*/$need" 2>/dev/null || true) | head -1 | cut -d: -f1) ;;
    esac
    [ -n "$pkg" ] || {
      echo "gpu-bundle: no installed package provides $need (the closure is found from the" \
        "packages installed here: run scripts/install-deps.sh first)" >&2
      exit 2
    }
    [ -n "${have[$pkg]:-}" ] && { echo "gpu-bundle: $pkg is in the bundle yet $need is missing" >&2; exit 2; }
    new+=("$pkg")
  done
  mapfile -t new < <(printf '%s\n' "${new[@]}" | sort -u)
  added+=("${new[@]}")
  fetch "${new[@]}"
done

# matio.pc links -lhdf5 from HDF5's serial folder, whose unversioned name only libhdf5-dev
# (headers and static libraries trainer does not use) would bring, and names that folder's
# include/ (matio's headers include nothing from it; CMake refuses a folder that is not there).
if [ -e "$stage/$arch_lib/libhdf5_serial.so.103" ]; then
  mkdir -p "$stage/$arch_lib/hdf5/serial/lib" "$stage/$arch_lib/hdf5/serial/include"
  ln -sf ../../../libhdf5_serial.so.103 "$stage/$arch_lib/hdf5/serial/lib/libhdf5.so"
fi

# Pruning.
rm -rf "$stage"/usr/share/{doc,doc-base,man,lintian,bug,locale,aclocal}
while IFS= read -r -d '' a; do
  [ -e "${a%.a}.so" ] && rm -f "$a"
done < <(find "$stage" -name '*.a' -print0)
keep_boost=$work/boost
mkdir -p "$keep_boost"
for d in "${boost_kept[@]}"; do mv "$stage/usr/include/boost/$d" "$keep_boost/"; done
find "$stage/usr/include/boost" -maxdepth 1 -type f -name '*.hpp' -exec mv {} "$keep_boost/" \;
rm -rf "$stage/usr/include/boost"
mv "$keep_boost" "$stage/usr/include/boost"

# Fashion-MNIST travels as raw IDX files, which xz packs 15% smaller than their gzip (trainer
# reads either).
find "$stage/usr/share/datasets" -name '*.gz' -exec gunzip {} +

dangling=$(find "$stage" -xtype l)
if [ -n "$dangling" ]; then
  echo "gpu-bundle: symbolic links that lead nowhere in the bundle:" >&2
  echo "$dangling" >&2
  exit 1
fi

XZ_OPT="-9 -T0" tar -C "$stage" -cJf "$out/trainer-gpu-bundle.tar.xz" .
size=$(stat -c %s "$out/trainer-gpu-bundle.tar.xz")
{
  echo "# trainer GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/gpu-bundle.sh"
  echo "# archive: $size bytes; unpacked: $(du -sb "$stage" | cut -f1) bytes"
  echo "# listed in scripts/deps.list:"
  for p in "${listed[@]}"; do echo "$p $(dpkg-deb -f "$work/debs/${p}"_*.deb Version)"; done
  echo "# added for run time:"
  for p in "${added[@]}"; do echo "$p $(dpkg-deb -f "$work/debs/${p}"_*.deb Version)"; done
} >"$out/MANIFEST"
echo "gpu-bundle: $out/trainer-gpu-bundle.tar.xz, $size bytes (${#listed[@]} packages listed, ${#added[@]} added for run time)"
if [ "$size" -gt "$limit_bytes" ]; then
  echo "gpu-bundle: the archive is over the $limit_bytes bytes it may take" >&2
  exit 1
fi
