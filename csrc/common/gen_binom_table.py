"""Writes fc_binom_table.h: C(n, j) for n = 0..256, j = 0..32, as two-word unsigned 128-bit numbers
(fc_dct_rank.h's fc_u128: {low word, high word}) saturated at 2^128 - 1.

    python csrc/common/gen_binom_table.py > csrc/common/fc_binom_table.h

Why a written table, not one computed at start: the CPU method and the CUDA kernels read the same
numbers (a device table must be initialised data, and a lazily filled host table would need a
lock); tests/core/test_dct_rank.py checks the header against math.comb.

Size: 33 x 257 entries of 16 bytes, 136 KB (68 KB when ranks were one word); on the device it is
global memory (fc_dct_rank.h says why)."""
from math import comb

ROWS = 33   # j <= 32: ranked dct coding needs k <= block / 2 (B = 64: k <= 32); B = 128 reaches it too
COLS = 257  # n <= 256: FC_DCT_MAX_BLOCK, the largest block the key table allows
SAT = (1 << 128) - 1
WORD = (1 << 64) - 1


def table():
    return [[min(comb(n, j), SAT) for n in range(COLS)] for j in range(ROWS)]


def main():
    print("/* fc_binom_table.h: written by gen_binom_table.py (beside it); do not edit. C(n, j) at\n"
          " * [j * FC_BINOM_COLS + n] as {low word, high word}, saturated at 2^128 - 1 (read through\n"
          " * fc_dct_rank.h's fc_binom). */")
    print("#ifndef FC_BINOM_TABLE_H\n#define FC_BINOM_TABLE_H\n")
    print(f"#define FC_BINOM_ROWS {ROWS}\n#define FC_BINOM_COLS {COLS}\n")
    print("#define FC_BINOM_TABLE_INIT \\\n    { \\")
    for j, row in enumerate(table()):
        for i in range(0, COLS, 3):
            print("        " + ", ".join(f"{{0x{v & WORD:x}ull, 0x{v >> 64:x}ull}}" for v in row[i:i + 3]) + ", \\")
    print("    }\n\n#endif")


if __name__ == "__main__":
    main()
