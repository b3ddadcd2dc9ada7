"""The glossary (seq2seq.inference.glossary): its file format, its one-line errors, and which
target terms a sentence calls for."""

from __future__ import annotations

import gzip

import pytest

from seq2seq.inference.glossary import Glossary, GlossaryError


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_the_file_format(tmp_path):
    path = write(tmp_path / "terms.tsv", "\ufeff# a comment\n\nHund\tdog\n"
                 "  Rotes Kreuz \t Red Cross\r\n\t \n#Katze\tcat\n")
    glossary = Glossary.load(path)
    assert [(e.source, e.target, e.line) for e in glossary.entries] == [
        ("Hund", "dog", 3), ("Rotes Kreuz", "Red Cross", 4)]
    assert glossary.name == str(path) and len(glossary) == 2
    packed = tmp_path / "terms.tsv.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert Glossary.load(packed).entries == glossary.entries


@pytest.mark.parametrize(("text", "message"), [
    ("Hund\tdog\nKatze cat\n", "line 2: expected SOURCE<TAB>TARGET, found 0 tabs"),
    ("Hund\tdog\tcanine\n", "line 1: expected SOURCE<TAB>TARGET, found 2 tabs"),
    ("Hund\t \n", "line 1: the target term is empty"),
    (" \tdog\n", "line 1: the source term is empty"),
    ("Hund\tdog\n\nHund\thound\n", "line 3: source term 'Hund' is already given on line 1"),
])
def test_a_malformed_line_is_one_line_naming_file_and_line(tmp_path, text, message):
    path = write(tmp_path / "terms.tsv", text)
    with pytest.raises(GlossaryError) as raised:
        Glossary.load(path)
    assert str(raised.value) == f"{path}: {message}"


def test_unreadable_files_are_one_line(tmp_path):
    with pytest.raises(GlossaryError, match="^terms file: file not found: .*nowhere.tsv$"):
        Glossary.load(tmp_path / "nowhere.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"Hund\tdog\nK\xe4se\tcheese\n")
    with pytest.raises(GlossaryError, match=r"bad.tsv: line 2 is not valid UTF-8 \(byte 0xe4"):
        Glossary.load(bad)
    # Case-insensitively, the same source term in another case is a repeat.
    write(bad, "Hund\tdog\nHUND\thound\n")
    assert len(Glossary.load(bad)) == 2
    with pytest.raises(GlossaryError, match="line 2: source term 'HUND' is already given"):
        Glossary.load(bad, ignore_case=True)


GLOSSARY = Glossary.parse(["Hund\tdog", "Rotes Kreuz\tRed Cross", "Kreuz\tcross",
                           "C++\tC++", "Welpe\tdog", "straße\tstreet"])


@pytest.mark.parametrize(("sentence", "terms"), [
    ("Ein Hund läuft.", ["dog"]),
    ("Der Hund, der Welpe und der Hund.", ["dog"]),  # each target term once
    ("Ein Hundehalter und ein Seehund.", []),  # inside longer words: no
    ("Hund", ["dog"]),
    ("(Hund)", ["dog"]),
    ("ein hund", []),  # case-sensitive
    ("Das Rotes  Kreuz hilft.", ["Red Cross", "cross"]),  # any spaces between words
    ("Rotes Kreuzfahrtschiff", []),
    ("Ich lerne C++ und C++11.", ["C++"]),
    ("Die Hauptstraße", []),
    ("", []),
])
def test_terms_found_as_whole_words(sentence, terms):
    assert GLOSSARY.constraints_for([sentence]) == [terms]


def test_ignore_case_and_one_list_per_sentence():
    glossary = Glossary.parse(["Hund\tdog", "rotes kreuz\tRed Cross", "Straße\tstreet"],
                              ignore_case=True)
    assert glossary.constraints_for(["ein HUND", "ROTES KREUZ", "Die STRASSE", "die straße",
                                     "Hunde"]) == [["dog"], ["Red Cross"], [], ["street"], []]
    assert glossary.constraints_for([]) == []
