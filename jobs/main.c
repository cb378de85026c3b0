/* placeholder; replaced by the CLI */
#include <stdio.h>
int main(void) { puts("tessera"); return 0; }
