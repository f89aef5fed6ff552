// Links one exported target alone (with --whole-archive: every object of it).
int main() { return 0; }
