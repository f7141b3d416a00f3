"""Writes the corpus's PDFs by hand-building PDF objects (no library): a catalog, a page tree, one
content stream per page drawing the text in Helvetica, and a correct cross-reference table.

Run ``python tests/corpus/make_pdfs.py`` to rewrite them; the output is deterministic. ``pdf_bytes``
is also used by the tests to build malformed and hostile PDFs around a valid skeleton.
"""

from __future__ import annotations

import textwrap
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINES_PER_PAGE = 46
WIDTH = 88


def _escape(line: str) -> str:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _content(lines: list[str]) -> bytes:
    ops = ["BT", "/F1 10 Tf", "14 TL", "56 780 Td"]
    for line in lines:
        ops.append(f"({_escape(line)}) '")
    ops.append("ET")
    return "\n".join(ops).encode("latin-1")


def pdf_bytes(pages: list[bytes], *, compress: bool = True, title: str = "", deflated: bool = False) -> bytes:
    """A PDF whose pages draw the given content streams (``deflated``: already zlib-compressed)."""
    n = len(pages)
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(f"{4 + 2 * i} 0 R".encode() for i in range(n))
        + f"] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, stream in enumerate(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 3 0 R >> >> "
            f"/Contents {5 + 2 * i} 0 R >>".encode()
        )
        data = stream if deflated or not compress else zlib.compress(stream, 9)
        flt = b" /Filter /FlateDecode" if compress or deflated else b""
        objects.append(b"<< /Length %d%s >>\nstream\n" % (len(data), flt) + data + b"\nendstream")
    if title:
        objects.append(f"<< /Title ({_escape(title)}) /Producer (respgate corpus) >>".encode("latin-1"))
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for num, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{num} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    info = f" /Info {len(objects)} 0 R" if title else ""
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{info} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def text_pdf(text: str, *, compress: bool = True, title: str = "") -> bytes:
    """A PDF of ``text``: paragraphs wrapped at ``WIDTH`` columns, ``LINES_PER_PAGE`` per page."""
    lines: list[str] = []
    for para in text.strip().split("\n\n"):
        lines.extend(textwrap.wrap(" ".join(para.split()), WIDTH) or [""])
        lines.append("")
    pages = [lines[i : i + LINES_PER_PAGE] for i in range(0, len(lines), LINES_PER_PAGE)]
    return pdf_bytes([_content(p) for p in pages], compress=compress, title=title)


BEEKEEPING = """
Inspecting a honey bee colony

A hive inspection in the active season, every seven to ten days, answers four questions: is
there a laying queen, does the colony have room, is it preparing to swarm, and is it healthy.

Work from the side of the hive, not in front of the entrance where the foragers fly. Puff a
little cool smoke at the entrance and under the crown board, wait a minute, then lift frames
slowly and hold them over the open box so a dropped queen falls back inside.

The queen. You rarely need to see her. Eggs standing upright in the bottom of cells, one per
cell, prove she was laying within the last three days. Several eggs in one cell, stuck to the
walls, point to laying workers in a colony that has lost its queen.

Room. A colony that fills every frame with brood and nectar will feel crowded and swarm. Add a
super (an extra box for honey) when bees cover seven or eight of the ten frames in the top box.

Swarm cells. Queen cells hanging from the bottom bars of the frames in late spring mean the
colony is preparing to swarm. An artificial swarm, moving the old queen to a new box on the
original site, usually satisfies the urge without losing half the bees over the fence.

Varroa mites are the main threat to colonies today. Monitor them with a sugar roll: shake about
300 bees from a brood frame into a jar with a mesh lid, add two spoonfuls of icing sugar, roll
the jar for a minute and shake the mites out onto a white tray. More than nine mites in 300 bees
in late summer means the colony needs treatment, typically with oxalic acid in the broodless
period of early winter, or with formic acid strips while honey supers are off.

Write every inspection down: date, temper of the colony, frames of brood, stores, queen cells and
the mite count. Patterns across weeks tell you more than any single visit.
"""

TIDE_POOLS = """
Life in the rock pools between the tides

The intertidal zone is the strip of shore that the sea covers at high tide and uncovers at low
tide. Animals that live there spend part of every day under water and part exposed to sun, wind,
rain and fresh water. Rock pools are refuges where water stays behind when the tide drops.

Zones. Ecologists divide the shore into bands. The splash zone at the top is wetted only by spray
and holds lichens and tiny periwinkles. The upper shore is dominated by barnacles and limpets,
which clamp shut or seal themselves against the rock to keep from drying out. The middle shore
has mussel beds and brown seaweeds. The lower shore, uncovered only at spring tides, is the
richest: anemones, starfish, sea urchins, and crabs hiding under boulders.

Beadlet anemones look like blobs of red jelly at low tide, but under water they open a ring of
stinging tentacles to catch shrimps and small fish. They defend their patch of rock against
neighbours with blue warts below the tentacles, packed with stinging cells.

A pool's water changes through the day. On a hot afternoon it warms, loses oxygen and becomes
saltier as it evaporates; heavy rain makes it fresher. Only hardy species survive in high pools,
which is why the pools nearer the sea hold more kinds of animals.

When exploring, turn stones over gently and put them back the way they lay: the animals under a
boulder die if they are left facing the sun. Check the tide times before you go and watch for the
returning sea, which can cut off a rocky point quickly.
"""

COMPOSTING = """
Hot composting in a garden bay

Composting turns kitchen and garden waste into a dark, crumbly soil improver. A cold heap works
slowly over a year or two; a hot heap, built all at once and turned, finishes in two or three
months and kills most weed seeds.

Carbon and nitrogen. Microbes need both. Green materials (grass clippings, vegetable peelings,
coffee grounds, fresh manure) are rich in nitrogen; brown materials (dry leaves, straw, shredded
cardboard, woody prunings) are rich in carbon. Aim for a carbon-to-nitrogen ratio of about 30 to
1 by weight, which in practice means roughly two to three buckets of browns for every bucket of
greens. Too many greens and the heap turns slimy and smells of ammonia; too many browns and it
sits there doing nothing.

Size and moisture. A heap needs to be at least one cubic metre to hold its heat. It should be as
damp as a wrung-out sponge: squeeze a handful and a drop or two of water should appear.

Temperature. Within a few days the centre of a well-built heap reaches 55 to 65 degrees Celsius.
When the temperature falls after a week or two, turn the heap, moving the outside to the middle,
and it will heat up again. After three or four turns it stays cool, and the compost should then
mature for a few weeks before use.

Leave out meat, dairy and cooked food in an open heap: they attract rats. Diseased plants and the
roots of perennial weeds such as bindweed belong in the green waste collection, not in the bay.
"""

DOCS = {
    "beekeeping_inspection.pdf": (BEEKEEPING, True),
    "tide_pool_ecology.pdf": (TIDE_POOLS, False),
    "hot_composting.pdf": (COMPOSTING, True),
}


def main() -> None:
    for name, (text, compress) in DOCS.items():
        title = text.strip().split("\n", 1)[0]
        (HERE / name).write_bytes(text_pdf(text, compress=compress, title=title))


if __name__ == "__main__":
    main()
