"""The text stream alone (csrc/core/loop/text_stream.hpp): UTF-8 held back across token
pieces, stop strings found across token boundaries, streamed pieces adding up to the
final text."""

import random

from fastpar import _testing as T


def feed(stream, pieces, stops=()):
    """Appends every piece, taking what can be streamed after each; returns (streamed, stopped)."""
    out, stopped = [], False
    for piece in pieces:
        stopped = stream.append(piece, list(stops))
        if stopped:
            break
        p = stream.next_piece(list(stops))
        if p:
            out.append(p)
    return out, stopped


def test_an_incomplete_utf8_character_is_held_back_until_it_completes():
    s = T.TextStream()
    euro = "€".encode()  # 3 bytes
    assert not s.append(b"price: " + euro[:1])
    assert s.next_piece() == "price: "
    assert not s.append(euro[1:2])
    assert s.next_piece() == ""  # still incomplete: nothing new
    assert not s.append(euro[2:] + b"5")
    assert s.next_piece() == "€5"
    assert s.take_text() == "price: €5"


def test_stop_string_split_over_tokens_ends_the_text_before_it():
    s = T.TextStream()
    stops = ["END"]
    out, stopped = feed(s, [b"hello E", b"N", b"D and more"], stops)
    assert stopped
    # "E" and "EN" may begin the stop string: held back, never streamed.
    assert out == ["hello "]
    assert s.next_piece(stops, final=True) == ""
    assert s.take_text() == "hello "


def test_a_held_back_prefix_that_does_not_become_a_stop_is_streamed():
    s = T.TextStream()
    stops = ["END"]
    out, stopped = feed(s, [b"an E", b"Nd", b"!"], stops)
    assert not stopped
    assert "".join(out) == "an ENd!"
    assert out[0] == "an "


def test_earliest_stop_wins_and_matches_are_found_once_complete():
    s = T.TextStream(streaming=False)
    assert not s.append(b"abc", ["cd", "bcx"])
    assert s.append(b"d", ["cd", "bcx"])
    assert s.take_text() == "ab"
    s = T.TextStream(streaming=False)
    assert s.append(b"xyz stop1 stop2", ["stop2", "stop1"])
    assert s.take_text() == "xyz "


def test_invalid_bytes_are_replaced_and_non_streaming_text_is_sanitised_whole():
    s = T.TextStream(streaming=False)
    s.append(b"ok \xff")
    s.append(b" \xe2\x82")  # a cut-off euro sign at the end
    assert s.take_text() == "ok \ufffd \ufffd"


def test_streamed_pieces_add_up_to_the_final_text():
    rng = random.Random(3)
    text = "Ünïcödé — 日本語のテキスト and emoji 🎉🎉, END of it. ".encode() * 3
    stops = ["END", "🎉🎉🎉"]
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 40)))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        s = T.TextStream()
        out, stopped = feed(s, pieces, stops)
        final = s.next_piece(stops, final=True)
        if final:
            out.append(final)
        whole = s.take_text()
        assert "".join(out) == whole
        assert stopped and whole == "Ünïcödé — 日本語のテキスト and emoji 🎉🎉, "
        for p in out:
            p.encode("utf-8")  # every piece is valid UTF-8 (a lone surrogate would raise)
            assert "\ufffd" not in p
