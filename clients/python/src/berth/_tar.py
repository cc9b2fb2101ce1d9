"""File and directory copies through ``/v1/sessions/{name}/archive`` (tar streams).

Extraction is written here rather than left to ``tarfile.extractall``: its
``filter="data"`` exists only from Python 3.11.4 / 3.10.12 / 3.9.17, and berth cp's
rules are stricter (only regular files, directories and symlinks that stay inside
the copy; staged, nothing written on error; a size bound), docs/api.md "Files".
"""

import os
import posixpath
import shutil
import tarfile
import tempfile
import threading
import urllib.parse
from typing import IO, TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from . import errors
from ._transport import CONNECTION_ERRORS, simple_request

if TYPE_CHECKING:
    from .client import Session

PIECE = 256 << 10


def _split_remote(remote: str, session: str) -> Tuple[str, str]:
    if not isinstance(remote, str) or not remote or "\0" in remote:
        raise errors.Invalid("remote path %r: want a path in the sandbox, e.g. /work/data" % (remote,), session=session)
    p = posixpath.normpath(remote)
    d, base = posixpath.split(p)
    if base in ("", ".", "..", "/"):
        raise errors.Invalid("remote path %r: name the file or directory the copy becomes, e.g. /work/data" % (remote,), session=session)
    return d or ".", base


def _check_tree(local: str, session: str) -> None:
    """Refuse, before anything is sent, what the daemon would refuse."""
    def check(path: str) -> None:
        st = os.lstat(path)
        import stat as S

        if not (S.S_ISREG(st.st_mode) or S.S_ISDIR(st.st_mode) or S.S_ISLNK(st.st_mode)):
            raise errors.Invalid(
                "upload %s: %s is not a regular file, directory or symlink; nothing was copied" % (local, path), session=session
            )

    check(local)
    if os.path.isdir(local) and not os.path.islink(local):
        for root, dirs, files in os.walk(local):
            for n in dirs + files:
                check(os.path.join(root, n))


def upload(s: "Session", local: str, remote: str) -> Dict[str, int]:
    rdir, base = _split_remote(remote, s.name)
    _check_tree(local, s.name)
    r, w = os.pipe()
    failure: List[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(w, "wb") as f:
                tf = tarfile.open(fileobj=f, mode="w|", format=tarfile.PAX_FORMAT)
                try:
                    _add(tf, local, base)
                except BaseException as e:
                    failure.append(e)
                    return  # no end-of-archive: the daemon sees a broken tar
                tf.close()
        except BaseException as e:
            failure.append(e)

    t = threading.Thread(target=produce, name="berth-upload", daemon=True)
    t.start()

    def body() -> Iterator[bytes]:
        with os.fdopen(r, "rb") as f:
            while True:
                b = f.read(PIECE)
                if not b:
                    break
                yield b
        t.join()
        if failure:
            raise failure[0]

    q = urllib.parse.urlencode({"path": rdir, "max_size": "unlimited"})
    try:
        status, _, data = simple_request(
            s.client._pool, "PUT", s._path + "/archive?" + q, body(), {"Content-Type": "application/x-tar"}, s.client.timeout
        )
    except errors.Unavailable:
        if failure:
            raise failure[0]
        raise
    if status != 200:
        raise errors.from_answer(status, data)
    import json

    return dict(json.loads(data))


def _add(tf: tarfile.TarFile, path: str, arcname: str) -> None:
    """Add path as arcname, recursively, without hard links (the daemon refuses them)."""
    tf.inodes = {}  # every regular file in full: never a hard-link entry
    ti = tf.gettarinfo(path, arcname)
    if ti.isreg():
        with open(path, "rb") as f:
            tf.addfile(ti, f)
    else:
        tf.addfile(ti)
    if ti.isdir():
        for n in sorted(os.listdir(path)):
            _add(tf, os.path.join(path, n), arcname + "/" + n)


class _Reader:
    """A file-like view of an HTTP answer that turns a broken connection into an error."""

    def __init__(self, resp: Any, ep: Any) -> None:
        self.resp = resp
        self.ep = ep

    def read(self, n: int = -1) -> bytes:
        try:
            return self.resp.read(n)
        except CONNECTION_ERRORS as e:
            raise self.ep.gone(e) from None


def download(s: "Session", remote: str, local: str, max_size: Optional[int]) -> None:
    if not isinstance(remote, str) or not remote or "\0" in remote:
        raise errors.Invalid("remote path %r: want a path in the sandbox" % (remote,), session=s.name)
    local = os.path.abspath(local)
    parent, lbase = os.path.split(local)
    if not lbase or lbase in (".", ".."):
        raise errors.Invalid("local path %r: name the file or directory the copy becomes" % (local,))
    if not os.path.isdir(parent):
        raise FileNotFoundError(2, "the local directory does not exist", parent)
    top = posixpath.basename(posixpath.normpath(remote)) or "."
    if posixpath.normpath(remote) == "/":
        top = "."
    pool = s.client._pool
    c = pool.get(s.client.timeout)
    stage = tempfile.mkdtemp(prefix=".berth-download-", dir=parent)
    ok = False
    try:
        try:
            c.http.request("GET", s._path + "/archive?" + urllib.parse.urlencode({"path": remote}), headers=pool.ep.headers())
            resp = c.http.getresponse()
        except CONNECTION_ERRORS as e:
            raise pool.ep.gone(e) from None
        if resp.status != 200:
            raise errors.from_answer(resp.status, resp.read(1 << 20))
        try:
            tf = tarfile.open(fileobj=_Reader(resp, pool.ep), mode="r|")
            _extract(tf, top, os.path.join(stage, "x"), max_size, s.name, remote)
        except tarfile.TarError as e:
            raise errors.Invalid("download %s: the sandbox sent a broken tar (%s); nothing was written" % (remote, e), session=s.name) from None
        if resp.read(1):
            pass  # tar padding after the end-of-archive blocks
        got = os.path.join(stage, "x")
        if not os.path.lexists(got):
            raise errors.Invalid("download %s: the archive held no entry %r; nothing was written" % (remote, top), session=s.name)
        if os.path.isdir(got) and not os.path.islink(got) and os.path.lexists(local):
            raise FileExistsError(17, "the download is a directory and the local path exists; remove it or pick another", local)
        os.replace(got, local)
        ok = resp.read() == b"" and not resp.will_close
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if ok:
            pool.put(c)
        else:
            c.close()


def _extract(tf: tarfile.TarFile, top: str, dest: str, max_size: Optional[int], session: str, remote: str) -> None:
    """Extract the stream tf, whose entries are top and top/..., as dest; refuse
    (berth.Invalid, nothing kept) anything but regular files, directories and
    symlinks that stay inside, and more than max_size bytes of files."""

    def bad(name: str, why: str) -> errors.Invalid:
        return errors.Invalid("download %s: entry %r %s; nothing was written" % (remote, name, why), session=session)

    total = 0
    links = set()  # relative paths of symlinks made: nothing is written through one
    dirs: List[Tuple[str, int, float]] = []
    for m in tf:
        name = m.name.rstrip("/")
        if name.startswith("/") or ".." in name.split("/"):
            raise bad(m.name, "leaves the copy")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if top != ".":
            if not parts or parts[0] != top:
                raise bad(m.name, "is not under %r" % top)
            parts = parts[1:]
        rel = "/".join(parts)
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in links:
                raise bad(m.name, "is under a symlink")
        if parts:
            os.makedirs(os.path.join(dest, *parts[:-1]) if len(parts) > 1 else os.path.dirname(dest), mode=0o700, exist_ok=True)
        target = os.path.join(dest, *parts) if parts else dest
        if os.path.lexists(target) and not (m.isdir() and os.path.isdir(target) and not os.path.islink(target)):
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
            links.discard(rel)
        if m.isdir():
            os.makedirs(target, mode=0o700, exist_ok=True)
            dirs.append((target, m.mode & 0o777, m.mtime))
        elif m.isreg():
            total += m.size
            if max_size is not None and total > max_size:
                raise errors.TooLarge("download %s: more than max_size=%d bytes of files; nothing was written" % (remote, max_size), session=session)
            f = tf.extractfile(m)
            assert f is not None
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(f, out, PIECE)
            os.chmod(target, m.mode & 0o777)
            os.utime(target, (m.mtime, m.mtime), follow_symlinks=False)
        elif m.issym():
            ln = m.linkname
            if ln.startswith("/") or not ln:
                raise bad(m.name, "is a symlink to %r, outside the copy" % ln)
            where = posixpath.normpath(posixpath.join(posixpath.dirname(rel), ln))
            if where == ".." or where.startswith("../") or (not parts):
                raise bad(m.name, "is a symlink to %r, outside the copy" % ln)
            os.symlink(ln, target)
            links.add(rel)
        else:
            raise bad(m.name, "is not a regular file, directory or symlink")
    for path, mode, mtime in reversed(dirs):
        os.chmod(path, mode)
        os.utime(path, (mtime, mtime))
