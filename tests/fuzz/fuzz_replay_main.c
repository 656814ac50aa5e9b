/* fuzz_replay_main.c - a plain main() for the fuzz targets: replays every file given on the command
 * line through LLVMFuzzerTestOneInput, so CI (any compiler, no libFuzzer) runs the committed seed
 * corpora under CTest and, in the sanitize build, under ASan + UBSan. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    static uint8_t buf[1 << 22]; /* [4 MiB] larger than any seed */
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            return 1;
        }
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("replayed %d inputs\n", argc - 1);
    return 0;
}
