#!/usr/bin/python3
"""The independent judge of src/vision: Debian's Pillow (python3-pil) does what DeepSeek's image
preprocessing does with an image (open, convert("RGB"), BICUBIC resize, ImageOps.pad), and the C++
test compares its bytes with ours. Usage: pillow_judge.py JOBS.json, a list of jobs:
  {"op": "make", "dir": D}                    sample files of every format and mode into D
  {"op": "decode", "in": F, "out": O}         O = raw RGB of F; prints nothing, writes O.json {w, h}
  {"op": "resize", "in": RAW, "w", "h", "ow", "oh", "out": O}
  {"op": "pad", "in": RAW, "w", "h", "ow", "oh", "out": O}   grey 127, centred
  {"op": "planned", "in": F, "ow", "oh", "plain": bool, "out": O}   F opened, RGB, then resized
      (plain) or padded to ow x oh: the pixels DeepSeek's processor gives the ViT"""
import json, os, random, sys

from PIL import Image, ImageOps


def sample(w, h, seed, mode="RGB"):
    rnd = random.Random(seed)
    im = Image.new("RGB", (w, h))
    px = im.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = ((x * 255 // max(1, w - 1) + rnd.randrange(40)) % 256,
                        (y * 255 // max(1, h - 1) + rnd.randrange(40)) % 256,
                        ((x + y) * 7 + rnd.randrange(90)) % 256)
    if mode == "RGB":
        return im
    if mode == "RGBA":
        im.putalpha(Image.linear_gradient("L").resize((w, h)))
        return im
    return im.convert(mode)


def make(d):
    os.makedirs(d, exist_ok=True)
    sample(37, 23, 1).save(f"{d}/rgb.png")
    sample(40, 31, 2, "RGBA").save(f"{d}/rgba.png")
    sample(33, 17, 3, "L").save(f"{d}/grey.png")
    g16 = Image.new("I;16", (21, 13))
    g16.putdata([(i * 997) % 65536 for i in range(21 * 13)])
    g16.save(f"{d}/grey16.png")
    p = sample(29, 19, 4).quantize(50)
    p.save(f"{d}/palette.png", transparency=3)
    sample(45, 27, 5).save(f"{d}/q90.jpg", quality=90)
    sample(45, 27, 6).save(f"{d}/q95_444.jpg", quality=95, subsampling=0)
    sample(64, 48, 7).save(f"{d}/progressive.jpg", quality=80, progressive=True)
    sample(30, 30, 8, "L").save(f"{d}/grey.jpg", quality=85)
    sample(41, 29, 9).save(f"{d}/lossy.webp", quality=80)
    sample(41, 29, 10).save(f"{d}/lossless.webp", lossless=True)
    sample(26, 22, 11, "RGBA").save(f"{d}/alpha.webp", lossless=True)
    sample(35, 25, 12).quantize(64).save(f"{d}/image.gif")


def raw(job):
    return Image.frombytes("RGB", (job["w"], job["h"]), open(job["in"], "rb").read())


for job in json.load(open(sys.argv[1])):
    op = job["op"]
    if op == "make":
        make(job["dir"])
    elif op == "decode":
        im = Image.open(job["in"]).convert("RGB")
        open(job["out"], "wb").write(im.tobytes())
        json.dump({"w": im.width, "h": im.height}, open(job["out"] + ".json", "w"))
    elif op == "resize":
        open(job["out"], "wb").write(
            raw(job).resize((job["ow"], job["oh"]), Image.BICUBIC).tobytes())
    elif op == "pad":
        out = ImageOps.pad(raw(job), (job["ow"], job["oh"]), method=Image.BICUBIC,
                           color=(127, 127, 127))
        open(job["out"], "wb").write(out.tobytes())
    elif op == "planned":
        im = Image.open(job["in"]).convert("RGB")
        size = (job["ow"], job["oh"])
        if job["plain"]:
            out = im.resize(size, Image.BICUBIC)
        else:
            out = ImageOps.pad(im, size, method=Image.BICUBIC, color=(127, 127, 127))
        open(job["out"], "wb").write(out.tobytes())
    else:
        sys.exit(f"unknown op {op}")
