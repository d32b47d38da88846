"""The one bounded reader: a device, a FIFO, a directory, a file over the limit, bad UTF-8 and
non-JSON constants are each refused in one line naming the file; nothing is read past the limit."""

import os

import pytest

from speedtronic.errors import ConfigError, DataError
from speedtronic.readlimit import read_bytes, read_json, read_text, size_words


def test_reads_a_small_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"a": [1, 2.5]}')
    assert read_json(p, 1 << 10, "config.json") == {"a": [1, 2.5]}


def test_refuses_a_device_without_reading_it():
    with pytest.raises(DataError, match=r"config.json /dev/zero: must be a regular file"):
        read_bytes("/dev/zero", 1 << 20, "config.json")


def test_refuses_a_fifo_and_a_directory(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="FIFO"):
        read_bytes(fifo, 10)
    with pytest.raises(ConfigError, match="is a directory"):
        read_bytes(tmp_path, 10, error=ConfigError)


def test_refuses_a_file_over_the_limit_naming_it(tmp_path):
    p = tmp_path / "big.txt"
    p.write_bytes(b"x" * 2049)
    with pytest.raises(DataError, match=r"big.txt: must be at most 2 KiB \(got 2049 bytes"):
        read_text(p, 2048)
    assert read_text(p, 4096) == "x" * 2049


@pytest.mark.parametrize("body", ['{"a": NaN}', '{"a": Infinity}', "[-Infinity]"])
def test_json_constants_that_are_not_json_are_refused(tmp_path, body):
    p = tmp_path / "c.json"
    p.write_text(body)
    with pytest.raises(DataError, match="not JSON"):
        read_json(p, 1 << 10)


def test_bad_utf8_and_deep_nesting(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(b"ok\xff")
    with pytest.raises(DataError, match=r"not UTF-8 text \(byte 2\)"):
        read_text(p, 100)
    p.write_text("[" * 200_000)
    with pytest.raises(DataError, match="nested too deeply|not valid JSON"):
        read_json(p, 1 << 20)


def test_size_words():
    assert [size_words(n) for n in (4 << 20, 64 << 10, 3)] == ["4 MiB", "64 KiB", "3 bytes"]


def test_a_tokenizer_file_is_read_with_a_bound(tmp_path):
    pytest.importorskip("tokenizers")
    from speedtronic.data.tokenizer import HFTokenizer

    with pytest.raises(DataError, match=r"data.tokenizer: /dev/zero: must be a regular file"):
        HFTokenizer("/dev/zero")
    with pytest.raises(DataError, match="file not found"):
        HFTokenizer(tmp_path / "missing.json")
