use super::*;

fn target(os: &str, arch: &str, cuda: bool, macos: Option<(u32, u32)>) -> Target {
    Target {
        os: os.into(),
        arch: arch.into(),
        cuda,
        macos,
    }
}

/// The files PyPI lists for MLX 0.32.4 (names as published), plus an older release.
fn listed(package: &str) -> Vec<WheelFile> {
    let stem = package.replace('-', "_");
    let names: Vec<String> = match package {
        "mlx-metal" => ["14_0", "15_0", "26_0"]
            .iter()
            .flat_map(|v| {
                [
                    format!("{stem}-0.31.2-py3-none-macosx_{v}_arm64.whl"),
                    format!("{stem}-{MLX_VERSION}-py3-none-macosx_{v}_arm64.whl"),
                ]
            })
            .collect(),
        _ => ["x86_64", "aarch64"]
            .iter()
            .map(|a| format!("{stem}-{MLX_VERSION}-py3-none-manylinux_2_35_{a}.whl"))
            .collect(),
    };
    names
        .into_iter()
        .map(|filename| WheelFile {
            url: format!("https://files.example/{filename}"),
            filename,
            sha256: "00".into(),
            size: None,
        })
        .collect()
}

fn pick(t: &Target) -> String {
    let wheel = t.wheel().unwrap();
    wheel.pick(&listed(wheel.package)).unwrap().filename.clone()
}

#[test]
fn a_mac_takes_the_metal_wheel_pip_would_take() {
    let mac = |v| target("macos", "aarch64", false, v);
    assert_eq!(mac(None).wheel().unwrap().backend, Backend::Metal);
    assert_eq!(mac(None).wheel().unwrap().library(), "libmlx.dylib");
    // The newest tag not newer than the Mac, as pip does.
    assert_eq!(
        pick(&mac(Some((15, 3)))),
        "mlx_metal-0.32.4-py3-none-macosx_15_0_arm64.whl"
    );
    assert_eq!(
        pick(&mac(Some((14, 0)))),
        "mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl"
    );
    assert_eq!(
        pick(&mac(Some((26, 1)))),
        "mlx_metal-0.32.4-py3-none-macosx_26_0_arm64.whl"
    );
    assert_eq!(
        pick(&mac(Some((25, 0)))),
        "mlx_metal-0.32.4-py3-none-macosx_15_0_arm64.whl"
    );
    // Unknown Mac: the oldest, which runs on all of them.
    assert_eq!(
        pick(&mac(None)),
        "mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl"
    );
    // Older than MLX supports: nothing, and the error names the floor.
    let old = mac(Some((13, 6))).wheel().unwrap();
    assert!(old.pick(&listed("mlx-metal")).is_none());
    assert!(old.describe().contains("macOS 14 or newer"));
}

#[test]
fn metal_is_not_a_feature_on_the_mac_and_cuda_is_refused_there() {
    // Whatever features the host crate passes, the Mac's only choice is Metal.
    let err = target("macos", "aarch64", true, None).wheel().unwrap_err();
    assert!(err.to_string().contains("drop the feature"), "{err}");
    assert!(target("macos", "x86_64", false, None).wheel().is_err());
}

#[test]
fn linux_takes_the_cpu_or_the_cuda_wheel_for_its_arch() {
    let cpu = target("linux", "x86_64", false, None);
    assert_eq!(cpu.wheel().unwrap().backend, Backend::Cpu);
    assert_eq!(
        pick(&cpu),
        "mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl"
    );
    let arm = target("linux", "aarch64", false, None);
    assert_eq!(
        pick(&arm),
        "mlx_cpu-0.32.4-py3-none-manylinux_2_35_aarch64.whl"
    );
    let cuda = target("linux", "x86_64", true, None);
    assert_eq!(cuda.wheel().unwrap().backend, Backend::Cuda);
    assert_eq!(cuda.wheel().unwrap().library(), "libmlx.so");
    assert_eq!(
        pick(&cuda),
        "mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl"
    );
    assert!(target("linux", "riscv64", false, None).wheel().is_err());
    assert!(target("windows", "x86_64", false, None).wheel().is_err());
}

#[test]
fn cache_names_keep_variants_apart() {
    let names: Vec<String> = [
        target("linux", "x86_64", false, None),
        target("linux", "x86_64", true, None),
        target("macos", "aarch64", false, None),
        target("macos", "aarch64", false, Some((15, 0))),
    ]
    .iter()
    .map(|t| t.wheel().unwrap().cache_name())
    .collect();
    assert_eq!(
        names,
        [
            "mlx-cpu-0.32.4",
            "mlx-cuda-13-0.32.4",
            "mlx-metal-0.32.4-macos-oldest",
            "mlx-metal-0.32.4-macos15.0"
        ]
    );
}

#[test]
fn macos_versions_parse_as_sw_vers_and_deployment_targets_write_them() {
    assert_eq!(parse_macos_version("15.3.1"), Some((15, 3)));
    assert_eq!(parse_macos_version("14"), Some((14, 0)));
    assert_eq!(parse_macos_version("26.0\n"), Some((26, 0)));
    assert_eq!(parse_macos_version("sonoma"), None);
    assert_eq!(
        macos_tag("mlx_metal-0.32.4-py3-none-macosx_26_0_arm64.whl"),
        Some((26, 0))
    );
    assert_eq!(
        macos_tag("mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl"),
        None
    );
}

#[test]
fn a_distribution_missing_the_metallib_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("mlx-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for f in [
        "mlx/lib/libmlx.dylib",
        "mlx/include/mlx/mlx.h",
        "mlx/share/cmake/MLX/MLXConfig.cmake",
    ] {
        std::fs::create_dir_all(dir.join(f).parent().unwrap()).unwrap();
        std::fs::write(dir.join(f), b"").unwrap();
    }
    let err = verify_layout(&dir, Backend::Metal).unwrap_err().to_string();
    assert!(err.contains("mlx/lib/mlx.metallib"), "{err}");
    std::fs::write(dir.join("mlx/lib/mlx.metallib"), b"").unwrap();
    // Another MLX release (an MLX_DIR from some other environment) is refused by version.
    let version = dir.join("mlx/share/cmake/MLX/MLXConfigVersion.cmake");
    std::fs::write(&version, "set(PACKAGE_VERSION \"0.29.1\")\n").unwrap();
    let err = verify_layout(&dir, Backend::Metal).unwrap_err().to_string();
    assert!(err.contains("holds MLX 0.29.1, not 0.32.4"), "{err}");
    std::fs::write(
        &version,
        format!("set(PACKAGE_VERSION \"{MLX_VERSION}\")\n"),
    )
    .unwrap();
    verify_layout(&dir, Backend::Metal).unwrap();
    assert_eq!(
        dist_root(&dir.join("mlx/share/cmake/MLX"), Backend::Metal),
        Some(dir.clone())
    );
    assert!(verify_layout(&dir, Backend::Cpu).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
