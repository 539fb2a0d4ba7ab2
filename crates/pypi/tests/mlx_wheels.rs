//! The MLX wheels each platform links, fetched from PyPI as the build fetches them: checked
//! (sha256), unpacked, and their layout verified. The macOS one is checked here on Linux, where
//! nothing can run it: what the Mac build relies on is that the layout and the library's
//! install name and dependencies are what `crates/mlx-sys/build/macos.rs` assumes.

use object::read::macho::{LoadCommandVariant, MachHeader, MachOFile64};
use object::{Endianness, Object};
use pypi::mlx::{self, Backend, Target};

fn dist_for(target: Target) -> std::path::PathBuf {
    let wheel = target.wheel().unwrap();
    mlx::fetch_dist(&wheel, &pypi::Index::pypi(), |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_macos_wheel_holds_a_metal_libmlx_with_an_rpath_install_name() {
    let dist = dist_for(Target {
        os: "macos".into(),
        arch: "aarch64".into(),
        cuda: false,
        macos: Some((14, 0)),
    });
    mlx::verify_layout(&dist, Backend::Metal).unwrap();
    let metallib = std::fs::metadata(dist.join("mlx/lib/mlx.metallib")).unwrap();
    assert!(
        metallib.len() > 1 << 20,
        "mlx.metallib is {} bytes",
        metallib.len()
    );

    let data = std::fs::read(dist.join("mlx/lib/libmlx.dylib")).unwrap();
    let file = MachOFile64::<Endianness>::parse(&*data).expect("libmlx.dylib is a 64-bit Mach-O");
    assert_eq!(file.architecture(), object::Architecture::Aarch64);
    let endian = file.endian();
    let mut commands = file
        .macho_header()
        .load_commands(endian, &*data, 0)
        .unwrap();
    let (mut id, mut deps) = (None, Vec::new());
    while let Some(command) = commands.next().unwrap() {
        match command.variant().unwrap() {
            LoadCommandVariant::IdDylib(d) => {
                id = Some(
                    String::from_utf8_lossy(command.string(endian, d.dylib.name).unwrap())
                        .into_owned(),
                )
            }
            LoadCommandVariant::Dylib(d) => deps.push(
                String::from_utf8_lossy(command.string(endian, d.dylib.name).unwrap()).into_owned(),
            ),
            _ => {}
        }
    }
    // Found through the binary's rpath (`@loader_path/../mlx/mlx/lib`, .cargo/config.toml).
    assert_eq!(id.as_deref(), Some("@rpath/libmlx.dylib"));
    // Only system libraries and frameworks besides: libmlx.dylib + mlx.metallib are all an
    // install has to ship.
    assert!(
        deps.iter()
            .any(|d| d.ends_with("Metal.framework/Versions/A/Metal")),
        "{deps:?}"
    );
    let foreign: Vec<_> = deps
        .iter()
        .filter(|d| !d.starts_with("/System/Library/") && !d.starts_with("/usr/lib/"))
        .collect();
    assert!(
        foreign.is_empty(),
        "libmlx.dylib needs non-system libraries: {foreign:?}"
    );
}

#[test]
fn the_linux_cpu_wheel_holds_libmlx_so() {
    let dist = dist_for(Target {
        os: "linux".into(),
        arch: "x86_64".into(),
        cuda: false,
        macos: None,
    });
    mlx::verify_layout(&dist, Backend::Cpu).unwrap();
    let data = std::fs::read(dist.join("mlx/lib/libmlx.so")).unwrap();
    let file = object::File::parse(&*data).unwrap();
    assert_eq!(file.architecture(), object::Architecture::X86_64);
}
