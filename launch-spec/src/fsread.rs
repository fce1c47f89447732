//! Bounded reads of files that must be regular files: configuration (every YAML file), launch specs
//! and the run-dir records submitter reads back; and the one way payload opens a record or log to
//! append to ([`open_append_regular`]).
//!
//! A FIFO opened for reading blocks until a writer appears, and `/dev/zero` never ends, so a plain
//! `read_to_string` can hang a command or grow it without bound. Every input is opened with
//! `O_NONBLOCK` (an open of a FIFO returns at once), type-checked with `fstat` on the open handle
//! (no race with a rename), and read up to a cap. Where the file lives in a directory others write
//! (a run dir), `O_NOFOLLOW` also refuses a symlink planted in place of a record.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Whether a symlink at the path itself is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Configuration: a symlinked profile or registry file is an ordinary setup.
    Follow,
    /// Run-dir records: written by payload and Harbor as plain files; a symlink is refused.
    Refuse,
}

/// Cap for one configuration file (the largest real registry file is a few kB).
pub const CONFIG_CAP: u64 = 4 << 20;
/// Cap for one JSON record (`status.json`, `launch.json`, a trial's `result.json`/`config.json`).
pub const RECORD_CAP: u64 = 16 << 20;

/// Opens `path` for reading without blocking and without following a final symlink when `links`
/// says so; anything but a regular file is an error naming what it is.
pub fn open_regular(path: &Path, links: Links) -> io::Result<File> {
    open_regular_meta(path, links).map(|(file, _)| file)
}

/// [`open_regular`] and the `fstat` it checked (size, modification time: no second `fstat`).
pub fn open_regular_meta(path: &Path, links: Links) -> io::Result<(File, std::fs::Metadata)> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path).map_err(|err| {
        if err.raw_os_error() == Some(libc::ELOOP) && links == Links::Refuse {
            io::Error::new(io::ErrorKind::InvalidInput, "is a symlink, not a regular file (refused)")
        } else {
            err
        }
    })?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok((file, meta));
    }
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("is {}, not a regular file", what(kind))))
}

/// Opens `path` for appending (created 0644 when absent) without blocking and without following a
/// final symlink; anything but a regular file is refused. `open(2)` of a FIFO for writing blocks
/// until a reader appears, so the open is `O_NONBLOCK` (a FIFO without a reader fails at once with
/// `ENXIO`), `fstat` checks the type, and the flag is cleared again: a child writing its log
/// through this handle must block on a full disk buffer, never see `EAGAIN`.
pub fn open_append_regular(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ENXIO) => io::Error::new(io::ErrorKind::InvalidInput, "is a FIFO, not a regular file (refused)"),
            Some(libc::ELOOP) => {
                io::Error::new(io::ErrorKind::InvalidInput, "is a symlink, not a regular file (refused)")
            }
            _ => err,
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {}, not a regular file (refused)", what(kind)),
        ));
    }
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(&file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(file)
}

/// What a file type is, in words.
fn what(kind: std::fs::FileType) -> &'static str {
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// The whole file, at most `cap` bytes: a larger file is an error rather than a partial read.
pub fn read_capped(path: &Path, cap: u64, links: Links) -> io::Result<Vec<u8>> {
    let file = open_regular(path, links)?;
    let len = file.metadata()?.len();
    if len > cap {
        return Err(too_large(len, cap));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // The file may grow between fstat and read: never take more than the cap.
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64, cap));
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text.
pub fn read_text_capped(path: &Path, cap: u64, links: Links) -> io::Result<String> {
    String::from_utf8(read_capped(path, cap, links)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

/// The last `window` bytes of a regular file (all of it when smaller), and the file's size.
pub fn read_tail(path: &Path, window: u64, links: Links) -> io::Result<(Vec<u8>, u64)> {
    let mut file = open_regular(path, links)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(window);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(window).read_to_end(&mut bytes)?;
    Ok((bytes, len))
}

/// Reads an open regular file of `len` bytes (its `fstat` size) into `buf`, at most `cap + 1`
/// bytes (more than `cap` means too large). Where the file still has `len` bytes this is one
/// `read` of `len + 1`: a regular file answers short only at its end, so the usual second,
/// empty read is saved (the trial scan reads two small files in each of thousands of dirs).
pub fn read_open(mut file: &File, len: u64, cap: u64, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    let want = usize::try_from(len.min(cap) + 1).unwrap_or(usize::MAX);
    buf.resize(want, 0);
    let mut got = 0;
    // Short of the size fstat gave: keep reading (an interrupted or odd read, a file cut meanwhile).
    while got < want {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                buf.clear();
                return Err(e);
            }
        }
        if got as u64 == len && got < want {
            break;
        }
    }
    buf.truncate(got);
    // Longer than fstat said: it grew meanwhile; read on, never past the cap.
    if got == want && (got as u64) <= cap {
        file.take(cap + 1 - got as u64).read_to_end(buf)?;
    }
    Ok(())
}

fn too_large(len: u64, cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("is {len} bytes, more than the {cap}-byte limit for this file (not read)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_symlink_device_and_oversize_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let err = read_capped(&fifo, 10, Links::Follow).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_capped(&link, 10, Links::Refuse).unwrap_err().to_string().contains("symlink"));
        assert!(read_capped(&link, 10, Links::Follow).unwrap_err().to_string().contains("character device"));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 100]).unwrap();
        assert!(read_capped(&big, 10, Links::Refuse).unwrap_err().to_string().contains("limit"));
        assert_eq!(read_capped(&big, 100, Links::Refuse).unwrap().len(), 100);
        let (tail, len) = read_tail(&big, 7, Links::Refuse).unwrap();
        assert_eq!((tail.len(), len), (7, 100));
    }

    #[test]
    fn append_refuses_a_fifo_a_symlink_and_a_device_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("events.jsonl");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(open_append_regular(&fifo).unwrap_err().to_string().contains("FIFO"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert!(open_append_regular(&link).unwrap_err().to_string().contains("symlink"));
        assert!(open_append_regular(Path::new("/dev/null")).unwrap_err().to_string().contains("character device"));
        let plain = dir.path().join("log");
        let mut f = open_append_regular(&plain).unwrap();
        std::io::Write::write_all(&mut f, b"a\n").unwrap();
        let flags = nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_eq!(flags & libc::O_NONBLOCK, 0, "blocking again once checked");
        std::io::Write::write_all(&mut open_append_regular(&plain).unwrap(), b"b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&plain).unwrap(), "a\nb\n");
    }

    #[test]
    fn read_open_reads_the_whole_file_whatever_fstat_said() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let text: Vec<u8> = (0..5000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&path, &text).unwrap();
        let (file, meta) = open_regular_meta(&path, Links::Refuse).unwrap();
        assert!(meta.is_file());
        let mut buf = b"left over".to_vec();
        // The size fstat gave, a stale smaller one (the file grew), a stale larger one (it shrank).
        for len in [meta.len(), 10, 0, 9000] {
            read_open(&file, len, RECORD_CAP, &mut buf).unwrap();
            assert_eq!(buf, text, "len {len}");
            std::io::Seek::rewind(&mut &file).unwrap();
        }
        // Never more than cap + 1 bytes.
        read_open(&file, meta.len(), 100, &mut buf).unwrap();
        assert_eq!(buf, text[..101]);
        std::io::Seek::rewind(&mut &file).unwrap();
        read_open(&file, 10, 100, &mut buf).unwrap();
        assert_eq!(buf, text[..101]);
    }
}
